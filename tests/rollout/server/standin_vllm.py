"""A stand-in for a vLLM server in multi-process runs: the routes the `vllm_server` engine calls (health, world size,
the weight-transfer handshake over tokenpo's gloo wire, pause/resume, tokens in and out), in the main test
environment (no vLLM). Its samples are random tokens of random lengths (seeded by each request's seed), labelled with
the weights' version; what it received is written to --record after every push: per push its version label, pause
mode, buckets and each tensor's float64 sum, and the lengths of every response it sampled.

--model: the folder tokenpo builds for the server it starts (its vocabulary size read from there).
`--die-in-push N --die-at-bucket B`: exits at once when bucket B of push N (both from 0) is announced, mid-push."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import threading
import urllib.parse
from datetime import timedelta
from pathlib import Path

import torch

from tokenpo.rollout.server.wire import broadcast, gloo_group


class State:
    group = None
    version = ""
    pushes: list[dict] = []
    lengths: list[int] = []
    lock = threading.Lock()


def record(args) -> None:
    with open(args.record + ".tmp", "w") as out:
        json.dump({"pushes": State.pushes, "lengths": State.lengths}, out)
    os.replace(args.record + ".tmp", args.record)


def samples(body: dict, vocab: int) -> dict:
    params = body["sampling_params"]
    stops = set(params["stop_token_ids"])
    choices = []
    for index in range(params["n"]):
        generator = torch.Generator().manual_seed(params["seed"] + index)
        length = int(torch.randint(1, params["max_tokens"] + 1, (1,), generator=generator))
        # a stop token only ever ends a response
        tokens = [t + 1 if t in stops else t for t in torch.randint(3, vocab - 1, (length,), generator=generator).tolist()]
        with State.lock:
            State.lengths.append(len(tokens))
        choices.append({"index": index, "token_ids": tokens,
                        "finish_reason": "length" if len(tokens) == params["max_tokens"] else "stop",
                        "logprobs": {"content": [{"logprob": -1.0} for _ in tokens]},
                        "weight_versions": [{"version": State.version, "start": 0, "end": len(tokens)}]})
    return {"choices": choices}


def handler(args):
    class Routes(http.server.BaseHTTPRequestHandler):
        def answer(self, body: dict) -> None:
            text = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self.answer({})
            elif self.path == "/get_world_size":
                self.answer({"world_size": 1})
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            route = urllib.parse.urlsplit(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if route.path == "/inference/v1/generate":
                return self.answer(samples(body, args.vocab))
            if route.path == "/init_weight_transfer_engine":
                info = body["init_info"]
                State.group = gloo_group(info["master_address"], info["master_port"], info["rank_offset"],
                                         info["world_size"], timedelta(seconds=info["timeout_s"]))
            elif route.path == "/pause":
                State.pushes.append({"mode": urllib.parse.parse_qs(route.query)["mode"][0], "buckets": 0, "sums": {}})
            elif route.path == "/update_weights":
                push = State.pushes[-1]
                if len(State.pushes) - 1 == args.die_in_push and push["buckets"] == args.die_at_bucket:
                    os._exit(3)
                info = body["update_info"]
                for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
                    tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                    broadcast(State.group, tensor)
                    push["sums"][name] = tensor.double().sum().item()
                push["buckets"] += 1
            elif route.path == "/finish_weight_update":
                State.version = State.pushes[-1]["version"] = body["weight_version"]
                record(args)
            self.answer({})

        def log_message(self, *args) -> None:
            pass

    return Routes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--vocab", type=int, help="the model's vocabulary size (or --model)")
    parser.add_argument("--model", help="the folder tokenpo gave the server: its config.json's vocabulary size")
    parser.add_argument("--record", required=True)
    parser.add_argument("--die-in-push", type=int, default=-1)
    parser.add_argument("--die-at-bucket", type=int, default=1)
    args = parser.parse_args()
    if args.model:  # as vLLM reads it: the config and the tokenizer must both be there
        args.vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
        assert (Path(args.model) / "tokenizer_config.json").is_file()
    http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler(args)).serve_forever()


if __name__ == "__main__":
    main()
