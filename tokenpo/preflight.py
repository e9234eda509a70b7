"""Start-up checks that stop a bad run in one line, in seconds, before any heavy work.

`check_command_line` composes the config the way Hydra will, before Hydra's main runs: Hydra's own report of an
unknown group option or key is 12-14 lines. `check_inputs` opens what the config points at (data files, the user
reward function, the checkpoint to resume, the model's weights) before a model loads or a worker starts.
Both raise ConfigError; `tokenpo.train` prints it as one line.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tokenpo.config import TrainConfig, build_config
from tokenpo.data.config import data_config_from_dict, data_keys_under
from tokenpo.data.example import Example
from tokenpo.data.loaders import check_local_files, first_example
from tokenpo.errors import ConfigError
from tokenpo.models.locate import check_weights_available
from tokenpo.rewards.config import RewardConfig
from tokenpo.rewards.weighted import check_user_rewards
from tokenpo.trainer import check_adapters, resume_dir_on_disk

# Hydra flags that do not run a job (help, info, completion, rerun) or that pick another config tree: left to Hydra
NOT_CHECKED_FLAGS = ("help", "hydra_help", "info", "shell_completion", "experimental_rerun", "config_path",
                     "config_name", "config_dir")


def check_command_line(conf_dir: str, config_name: str, argv: list[str]) -> None:
    """Every group option and key the command line names exists, and each job's config validates.

    A sweep is composed once per value of each swept key (the other keys at their first value), not as the whole
    cartesian product.
    """
    args = get_args_parser().parse_args(argv)
    if any(getattr(args, flag) for flag in NOT_CHECKED_FLAGS):
        return
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        try:
            overrides = OverridesParser.create(config_loader=loader).parse_overrides(args.overrides)
        except OverrideParseException as err:
            raise ConfigError(f"{err.override}: {one_line(err)}") from err
        for override in overrides:
            check_group_option(loader, override)
        jobs = job_overrides(overrides)
        # one composition of the first job gives its config and hydra.mode (each composition takes ~0.3 s)
        first, mode = compose_with_mode(config_name, jobs[0])
        configs = [first, *(compose_and_validate(config_name, job) for job in jobs[1:])]
        multirun = args.multirun or mode == RunMode.MULTIRUN
        sweep = next((o for o in overrides if o.is_sweep_override()), None)
        if sweep is not None and not multirun:
            raise ConfigError(f"{sweep.input_line} sweeps over several values: add -m to run one job per value "
                              "(or write a list as key=[a,b], a string with commas as key='a,b')")
        if multirun:
            for job, cfg in zip(jobs, configs):
                check_sweep_job(config_name, job, cfg, swept_keys(overrides))


def group_exists(loader, group: str) -> bool:
    parent, _, name = group.rpartition("/")
    return name in loader.list_groups(parent)


def group_options(loader, group: str) -> list[str]:
    """The options of a config group as Hydra names them; those in subfolders as sub/option."""
    nested = [f"{sub}/{option}" for sub in loader.list_groups(group)
              for option in group_options(loader, f"{group}/{sub}")]
    return sorted(loader.get_group_options(group) + nested)


def check_group_option(loader, override: Override) -> None:
    """`group=option` names an existing option (an unknown option of an optional group, such as experiment, would
    otherwise be skipped without a word)."""
    group = override.key_or_group
    if override.is_delete() or not group_exists(loader, group):
        return
    if override.is_discrete_sweep():
        values = list(override.sweep_iterator())
    else:
        values = [] if override.is_sweep_override() else [override.value()]
    options = group_options(loader, group)
    for value in values:
        if isinstance(value, str) and value not in options:
            raise ConfigError(f"{group}={value}: no such option in config group {group!r} "
                              f"(available: {', '.join(options)}){plugin_hint(group, value)}")


def job_overrides(overrides: list[Override]) -> list[list[str]]:
    """Override lists that together take every value of every swept key once, the other keys at their first value.

    A sweep with no listable values (a glob matching nothing, a search's interval()) is left to the sweeper.
    """
    lines = []
    for override in overrides:
        if not override.is_sweep_override():
            lines.append([override.input_line])
        elif override.is_discrete_sweep():
            lines.append([f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()])
    lines = [values for values in lines if values]
    first = [values[0] for values in lines]
    jobs = [first]
    for i, values in enumerate(lines):
        jobs += [first[:i] + [value] + first[i + 1:] for value in values[1:]]
    return jobs


def compose_with_mode(config_name: str, overrides: list[str]) -> tuple[TrainConfig, RunMode]:
    """The validated config and hydra.mode (MULTIRUN where the config itself asks for a sweep, as a hyper-parameter
    search experiment does), from one composition."""
    with composition_errors(config_name, overrides):
        tree = compose(config_name, overrides=overrides, return_hydra_config=True)
        mode = tree.hydra.mode
        return build_config(OmegaConf.masked_copy(tree, [key for key in tree if key != "hydra"])), mode


def compose_and_validate(config_name: str, overrides: list[str]) -> TrainConfig:
    with composition_errors(config_name, overrides):
        return build_config(compose(config_name, overrides=overrides))


@contextmanager
def composition_errors(config_name: str, overrides: list[str]) -> Iterator[None]:
    """Hydra's and OmegaConf's errors while composing `overrides` as one-line ConfigErrors."""
    try:
        yield
    except MissingConfigException as err:
        first_line = str(err).splitlines()[0]
        group = (err.missing_cfg_file or "").rpartition("/")[0]
        available = f" (available in {group!r}: {', '.join(err.options)})" if err.options else ""
        raise ConfigError(f"{first_line}{available}{plugin_hint(group, err.missing_cfg_file or '')}") from err
    except HydraException as err:
        full_key = getattr(err.__cause__, "full_key", None)
        if full_key and "not in struct" in str(err.__cause__):
            raise ConfigError(unknown_key(config_name, overrides, full_key)) from err
        raise ConfigError(one_line(err)) from err
    except OmegaConfBaseException as err:  # e.g. an interpolation that does not resolve
        raise ConfigError(one_line(err)) from err


def unknown_key(config_name: str, overrides: list[str], full_key: str) -> str:
    """'trainer.foo=1: unknown key trainer.foo (known: ...)', the known keys read from the config composed without
    the overrides that name the unknown key."""
    def names_it(line: str) -> bool:
        key = line.split("=", 1)[0].lstrip("+~")
        return key == full_key or key.startswith(full_key + ".")

    bad = [line for line in overrides if names_it(line)]
    tree = compose(config_name, overrides=[line for line in overrides if not names_it(line)])
    parent = full_key.rpartition(".")[0]
    node = OmegaConf.select(tree, parent) if parent else tree
    known = f" (known: {', '.join(sorted(node))})" if isinstance(node, DictConfig) else f" ({parent} is not a mapping)"
    return f"{', '.join(bad) or full_key}: unknown key {full_key}{known}"


def one_line(err: Exception) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


def check_rewards_on_sample(reward: RewardConfig, sample: Example | None) -> None:
    """reward.fn and the user functions of reward.functions imported and called once on the data's first problem (a
    built-in one where the data is not read at start-up) with a response answering its gold: one that fails there
    stops the run in one line, before a step is spent on it."""
    where = "the data's first problem"
    if sample is None:
        sample, where = Example("sample", "What is 1 + 1?", "2"), "a built-in sample (1 + 1 = 2; the data loads later)"
    where = f"{where} ({sample.problem[:60]!r}, gold {sample.answer!r})"
    check_user_rewards(reward.fn, reward.functions, sample.problem, sample.answer, dict(sample.meta), where,
                       reward.timeout_s)


def check_inputs(cfg: TrainConfig, run_dir: Path) -> None:
    """The data files (training and benchmark), the user reward function, the checkpoint to resume and the model's
    weights can be read; nothing heavy is loaded, and torch, transformers and DeepSpeed are not imported (a LoRA run's
    target modules, checked last, need transformers)."""
    sample = first_example(cfg.data)  # a local file's check
    for benchmark, key in zip(cfg.eval.benchmarks(), cfg.eval.data_keys()):
        if benchmark.data is not None:
            with data_keys_under(key):
                check_local_files(data_config_from_dict(benchmark.data))
    check_rewards_on_sample(cfg.reward, sample)
    resume_dir = resume_dir_on_disk(cfg.trainer.resume, run_dir, quick=True)
    if resume_dir is not None:
        check_adapters(resume_dir, cfg.model.lora.settings())
    check_weights_available(cfg.model)
    if cfg.model.lora.enabled:
        # last: the one check that needs transformers (it lists the model's modules on the meta device)
        from tokenpo.models.lora import check_targets_before_loading

        check_targets_before_loading(cfg.model)


# Hydra plugin options that tokenpo[cluster] installs (docs/cluster.md), each with the library it runs on
CLUSTER_PLUGINS = {"hydra/launcher": {"submitit_local": "submitit", "submitit_slurm": "submitit", "joblib": "joblib"},
                   "hydra/sweeper": {"optuna": "optuna"}}
INSTALL_CLUSTER = "install tokenpo[cluster] (pip install 'tokenpo[cluster]'; bash scripts/setup.sh does)"


def plugin_hint(group: str, option: str) -> str:
    """'; install tokenpo[cluster]' when `option` (or the config file path it names) is one of its plugins'."""
    option = option.rpartition("/")[2] if option.startswith(group + "/") else option
    return f": a Hydra plugin, {INSTALL_CLUSTER}" if option in CLUSTER_PLUGINS.get(group, {}) else ""


def swept_keys(overrides: list[Override]) -> set[str]:
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def check_sweep_job(config_name: str, overrides: list[str], cfg: TrainConfig, swept: set[str]) -> None:
    """A sweep's job can start where its launcher puts it: the launcher's and sweeper's libraries import, a submitit
    job's tasks per node are the run's processes (trainer.nproc), and trainer.objective is a metric the run logs."""
    import importlib
    import shutil

    from tokenpo.trainer import check_objective

    hydra = compose(config_name, overrides=overrides, return_hydra_config=True).hydra
    for group, choice in (("hydra/launcher", hydra.runtime.choices.get("hydra/launcher")),
                          ("hydra/sweeper", hydra.runtime.choices.get("hydra/sweeper"))):
        # a preset (conf/hydra/launcher/slurm.yaml) names its plugin's config in its defaults: read its target
        target = OmegaConf.select(hydra, group.replace("hydra/", "") + "._target_") or ""
        library = next((lib for lib in CLUSTER_PLUGINS[group].values() if lib in target.lower()), None)
        if library is not None:
            try:
                importlib.import_module(library)
            except ImportError as err:
                raise ConfigError(f"{group}={choice} needs {library} ({err}): {INSTALL_CLUSTER}") from err
    launcher = hydra.launcher
    if launcher._target_.endswith("SlurmLauncher") and shutil.which("sbatch") is None:
        raise ConfigError(f"hydra/launcher={hydra.runtime.choices['hydra/launcher']} submits Slurm jobs, but this "
                          "machine has no sbatch: run it on a Slurm login node (hydra/launcher=submitit_local here)")
    if "tasks_per_node" in launcher:  # submitit: one task per process of the run, the same count on every node
        nproc = cfg.trainer.nproc
        if "trainer.nproc" in swept:
            raise ConfigError("trainer.nproc is swept but a submitit launcher fixes its tasks per node for the whole "
                              "sweep: run one sweep per trainer.nproc")
        if launcher.tasks_per_node != nproc:
            raise ConfigError(f"hydra.launcher.tasks_per_node={launcher.tasks_per_node} but trainer.nproc={nproc}: "
                              "a submitit job runs one task per training process, set them equal")
        gpus = launcher.get("gpus_per_node")
        if gpus and gpus != nproc:
            raise ConfigError(f"hydra.launcher.gpus_per_node={gpus} but trainer.nproc={nproc}: one GPU per process "
                              "(0 or null on CPUs)")
    check_objective(cfg)
