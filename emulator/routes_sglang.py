"""SGLang-only endpoints: /v1/models/{model}, /model_info, /server_info, /flush_cache.

Shapes per WIRE_SPEC §1/§3. /server_info lists the subset of server arguments a router
reads (context length, page size, limits, the served name) plus `internal_states`,
`version` and `frontend`; the deprecated `/get_model_info` and `/get_server_info`
aliases answer the same. /v1/loads is not emulated (404), so smg-style routers fall back
to /metrics.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from emulator.config import EmulatorConfig
from emulator.state import EMU
from emulator.wire_sglang import SglangWire

FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or"
    " waiting requests, the operation will not be performed.)\n"
)
_STARTED = time.time()


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def _model(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    name = request.match_info["model"]
    if name not in emu.cfg.served_names:
        err = {"message": f"The model '{name}' does not exist", "type": "invalid_request_error",
               "param": "model", "code": "model_not_found"}  # fmt: skip
        return _json({"error": err}, 404)
    return _json(SglangWire().model_card(name, emu.info.max_model_len, int(time.time())))


async def _model_info(request: web.Request) -> web.Response:
    cfg = request.app[EMU].cfg
    return _json(
        {
            "model_path": cfg.model_path,
            "served_model_name": cfg.served_names[0],
            "tokenizer_path": cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }
    )


def server_args(cfg: EmulatorConfig) -> dict[str, object]:
    e = cfg.engine
    return {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.served_names[0],
        "host": cfg.host,
        "port": cfg.port,
        "context_length": e.max_model_len,
        "max_running_requests": e.max_num_seqs,
        "max_total_tokens": e.num_kv_blocks * e.block_size,
        "chunked_prefill_size": e.prefill_chunk,
        "page_size": 1,
        "disable_radix_cache": not e.enable_prefix_caching,
        "schedule_policy": "fcfs",
        "tp_size": 1,
        "dp_size": 1,
        "enable_metrics": cfg.enable_metrics,
        "enable_cache_report": cfg.prompt_tokens_details,
        "random_seed": cfg.seed,
    }


async def _server_info(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    stats = emu.driver.engine.stats
    internal = {
        "last_gen_throughput": emu.metrics.throughput.rate(emu.driver.clock.wall_now())
        if hasattr(emu.metrics, "throughput")
        else 0.0,
        "memory_usage": {
            "token_capacity": emu.cfg.engine.num_kv_blocks * emu.cfg.engine.block_size
        },
        "num_running_reqs": stats.running,
        "num_queue_reqs": stats.waiting,
    }
    return _json(
        {
            **server_args(emu.cfg),
            "internal_states": [internal],
            "startup_time": _STARTED,
            "version": emu.cfg.version,
            "frontend": "python",
        }
    )


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(body=FLUSHED.encode())


def sglang_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/v1/models/{model:.+}", _model, allow_head=False)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, _model_info, allow_head=False)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, _server_info, allow_head=False)
    r.add_get("/flush_cache", _flush_cache, allow_head=False)
    r.add_post("/flush_cache", _flush_cache)
