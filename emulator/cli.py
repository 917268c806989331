"""`fleetgate emulate`: serve an emulated vLLM 0.33 or SGLang 0.5.23 on the engine model.

    python -m fleetgate emulate --port 8001 --model llama-8b --time-scale 0.01

Engine flags accept both servers' spellings (--max-model-len / --context-length,
--max-num-seqs / --max-running-requests, --served-model-name / --model). KV capacity is
--num-kv-blocks blocks of --block-size tokens, or --kv-tokens tokens. Prints one line
with the URL once the socket listens; SIGTERM/SIGINT stop it cleanly (exit 0);
SIGUSR1 toggles a failing /health.
"""

from __future__ import annotations

import argparse
import logging
import sys

from emulator.config import DEFAULT_MODEL_PATH, EmulatorConfig, Faults
from emulator.dp_engine import DpConfig
from emulator.engine import EngineConfig
from emulator.kv_events import parse_config as parse_kv_events
from emulator.pd_config import add_arguments as add_pd_arguments
from emulator.pd_config import from_args as pd_from_args


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate emulate",
        description="An emulated vLLM or SGLang server: real HTTP, modelled engine timing.",
        allow_abbrev=False,
    )
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=None, help="default 8000 (vllm) / 30000 (sglang)")
    s.add_argument("--personality", choices=("vllm", "sglang"), default="vllm")
    s.add_argument("--model", "--served-model-name", dest="models", action="append", metavar="NAME",
                   help="served model name; repeat for aliases (default: the model path)")  # fmt: skip
    s.add_argument("--model-path", "--root", dest="model_path", default=DEFAULT_MODEL_PATH,
                   help="the model path reported as `root` / model_path")  # fmt: skip
    s.add_argument("--api-key", default=None)
    s.add_argument("--enable-request-id-headers", action="store_true",
                   help="vLLM: echo X-Request-Id on responses")  # fmt: skip
    s.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help="vLLM's: publish KV-cache events over ZMQ (emulator/kv_events.py)")  # fmt: skip
    s.add_argument("--enable-prompt-tokens-details", "--enable-cache-report", dest="details",
                   action="store_true", help="usage.prompt_tokens_details with cached_tokens")  # fmt: skip
    s.add_argument("--enable-metrics", action=argparse.BooleanOptionalAction, default=True,
                   help="SGLang serves /metrics only with this (default on)")  # fmt: skip
    s.add_argument("--log-level", default="warning")
    s.add_argument("--tokenizer", default="cl100k", metavar="cl100k|hf:PATH",
                   help="what prompts cost: cl100k in Llama-3.0's layout, or a tokenizer folder "
                   "(tokenizer.json + its chat template)")  # fmt: skip

    d = EngineConfig()
    e = p.add_argument_group("engine model")
    e.add_argument(
        "--max-model-len",
        "--context-length",
        dest="max_model_len",
        type=int,
        default=d.max_model_len,
    )
    e.add_argument("--block-size", type=int, default=d.block_size)
    e.add_argument("--num-kv-blocks", type=int, default=None, help=f"default {d.num_kv_blocks}")
    e.add_argument(
        "--kv-tokens", type=int, default=None, help="KV capacity in tokens (instead of blocks)"
    )
    e.add_argument(
        "--max-num-seqs",
        "--max-running-requests",
        dest="max_num_seqs",
        type=int,
        default=d.max_num_seqs,
    )
    e.add_argument("--w", type=float, default=d.w, help="seconds per step (W)")
    e.add_argument("--h", type=float, default=d.h, help="seconds per step per running request (H)")
    e.add_argument(
        "--prefill-chunk",
        "--chunked-prefill-size",
        dest="prefill_chunk",
        type=int,
        default=d.prefill_chunk,
    )
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--prefill-token-s", type=float, default=d.prefill_token_s,
                   help="seconds per prompt token a step computes (compute-bound prefill; "
                   "default 0: FleetOpt's W + H·n step)")  # fmt: skip
    e.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="tokens one step computes at most, shared by prefill chunks "
                   "(default: no budget)")  # fmt: skip
    e.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per engine second (0.01: 100x faster)",
    )
    e.add_argument(
        "--max-lag",
        type=float,
        default=0.05,
        help="wall seconds behind schedule before a stall counts as engine time",
    )
    e.add_argument("--seed", type=int, default=0)
    e.add_argument(
        "--mean-output-tokens",
        type=float,
        default=128.0,
        help="mean natural answer length (EOS model)",
    )

    dp = p.add_argument_group("data parallel (emulator/dp_engine.py)")
    dp.add_argument(
        "--data-parallel-size",
        "--dp-size",
        "--dp",
        dest="dp_size",
        type=int,
        default=1,
        metavar="G",
        help="G ranks stepping in lockstep; a request names its rank with"
        " X-data-parallel-rank (SGLang: also routed_dp_rank / data_parallel_rank)",
    )
    dp.add_argument(
        "--data-parallel-rank-ports",
        dest="dp_rank_ports",
        type=int,
        default=None,
        metavar="BASE",
        help="also serve rank g alone on port BASE + g (vLLM's external load balancing: an"
        " API server per rank; the ranks still step in lockstep); --port keeps the whole group",
    )
    dp.add_argument(
        "--dp-t-sync",
        type=float,
        default=DpConfig().t_sync,
        help="seconds per step at the ranks' barrier (T_sync)",
    )
    dp.add_argument(
        "--dp-k",
        type=float,
        default=DpConfig().k,
        help="seconds per step per context token a rank holds (K)",
    )
    f = p.add_argument_group("fault injection")
    f.add_argument(
        "--error-rate", type=float, default=0.0, help="fraction of generation requests answered 500"
    )
    f.add_argument(
        "--added-latency-ms",
        type=float,
        default=0.0,
        help="delay before a request reaches the engine",
    )
    f.add_argument("--die-mid-stream-after", type=int, default=0, metavar="N",
                   help="cut every stream's connection after N SSE events")  # fmt: skip
    f.add_argument(
        "--die-exits",
        action="store_true",
        help="with --die-mid-stream-after: exit the process there",
    )
    f.add_argument("--crash-after-requests", type=int, default=0, metavar="N",
                   help="exit abruptly when generation request N+1 arrives")  # fmt: skip
    f.add_argument(
        "--fail-health", action="store_true", help="/health answers 503 (SIGUSR1 toggles)"
    )
    add_pd_arguments(p)
    return p


def config_from(args: argparse.Namespace) -> EmulatorConfig:
    if args.num_kv_blocks is not None and args.kv_tokens is not None:
        raise ValueError("give --num-kv-blocks or --kv-tokens, not both")
    blocks = args.num_kv_blocks
    if args.kv_tokens is not None:
        blocks = -(-args.kv_tokens // args.block_size)
    engine = EngineConfig(
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        num_kv_blocks=blocks if blocks is not None else EngineConfig().num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        prefill_chunk=args.prefill_chunk,
        w=args.w,
        h=args.h,
        enable_prefix_caching=not args.no_prefix_caching,
        prefill_token_s=args.prefill_token_s,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    if engine.num_kv_blocks * engine.block_size < engine.max_model_len:
        # vLLM refuses to start when one max-length request cannot fit the KV cache.
        raise ValueError(
            f"the KV cache ({engine.num_kv_blocks * engine.block_size} tokens) is smaller than"
            f" --max-model-len ({engine.max_model_len}): one request must always fit"
        )
    if not 0.0 <= args.error_rate <= 1.0:
        raise ValueError("--error-rate must be in [0, 1]")
    if args.time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    port = args.port if args.port is not None else (8000 if args.personality == "vllm" else 30000)
    kv_events = parse_kv_events(args.kv_events_config)
    base = args.dp_rank_ports
    if base is not None and args.dp_size < 2:
        raise ValueError("--data-parallel-rank-ports: only with --data-parallel-size > 1")
    if base is not None and not (
        base > 0 and base + args.dp_size - 1 <= 65535 and not base <= port < base + args.dp_size
    ):
        raise ValueError(
            f"--data-parallel-rank-ports {base}: ports {base}..{base + args.dp_size - 1}"
            f" must be valid and not include --port {port}"
        )
    if kv_events is not None and args.dp_size > 1:
        raise ValueError("--kv-events-config: not with --data-parallel-size > 1")
    return EmulatorConfig(
        host=args.host,
        port=port,
        personality=args.personality,
        served_names=tuple(args.models) if args.models else (args.model_path,),
        model_path=args.model_path,
        engine=engine,
        time_scale=args.time_scale,
        max_lag=args.max_lag,
        seed=args.seed,
        mean_output_tokens=args.mean_output_tokens,
        api_key=args.api_key,
        enable_request_id_headers=args.enable_request_id_headers,
        prompt_tokens_details=args.details,
        enable_metrics=args.enable_metrics,
        dp=DpConfig(args.dp_size, args.dp_t_sync, args.dp_k),
        dp_rank_ports=base,
        kv_events=kv_events,
        faults=Faults(
            error_rate=args.error_rate,
            added_latency_ms=args.added_latency_ms,
            die_mid_stream_after=args.die_mid_stream_after,
            die_exits=args.die_exits,
            crash_after_requests=args.crash_after_requests,
            fail_health=args.fail_health,
        ),
        pd=pd_from_args(args),
    )


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        cfg = config_from(args)
        if args.tokenizer != "cl100k":
            from emulator.chat_template import use_tokenizer

            use_tokenizer(args.tokenizer)
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from emulator.server import run

    def ready(url: str) -> None:
        names = ", ".join(cfg.served_names)
        print(
            f"fleetgate emulate: {cfg.personality} {cfg.version} serving {names} on {url}",
            flush=True,
        )

    try:
        run(cfg, ready)
    except OSError as exc:
        print(f"fleetgate emulate: {exc}", file=sys.stderr)
        return 1
    return 0
