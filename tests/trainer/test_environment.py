import json
import logging

import torch

from tokenpo.trainer.harness.environment import ENVIRONMENT_FILE, numerics_environment, processor_name, record_environment


def test_processor_name_is_the_cpuinfo_model_name(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454 48-Core Processor\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9454 48-Core Processor\n")
    assert processor_name(cpuinfo) == "AMD EPYC 9454 48-Core Processor"
    assert processor_name(tmp_path / "missing")  # elsewhere the platform's name, never empty


def test_environment_holds_the_thread_count_and_the_kernels_instruction_set():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        environment = numerics_environment(world_size=2)
    finally:
        torch.set_num_threads(threads)
    assert environment["threads"] == 1 and environment["processes"] == 2
    assert environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert environment["torch"] == torch.__version__
    assert set(environment) == {"device", "cpu_capability", "threads", "processes", "torch", "transformers", "deepspeed"}


def test_each_start_appends_its_environment(tmp_path):
    record_environment(tmp_path, 0, 1)
    record_environment(tmp_path, 3, 1)
    starts = json.loads((tmp_path / ENVIRONMENT_FILE).read_text())
    assert [start["from_step"] for start in starts] == [0, 3]
    assert starts[0] == {**starts[1], "from_step": 0}


def test_an_unreadable_record_is_replaced_with_a_warning(tmp_path, caplog):
    (tmp_path / ENVIRONMENT_FILE).write_text('{"device": "trunc')
    with caplog.at_level(logging.WARNING, logger="tokenpo"):
        record_environment(tmp_path, 5, 1)
    assert [start["from_step"] for start in json.loads((tmp_path / ENVIRONMENT_FILE).read_text())] == [5]
    assert "not a JSON list of starts" in caplog.text
