from gateway.telemetry import apply, parse_metrics
from gateway.workers import Telemetry

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:num_requests_running_fake 99
"""

SGLANG_OPENMETRICS = """# TYPE sglang:num_running_reqs gauge
sglang_num_running_reqs{model_name="m",tp_rank="0"} 7.0
sglang_num_queue_reqs{model_name="m",tp_rank="0"} 1.0
sglang_token_usage{model_name="m",tp_rank="0"} 0.75
sglang_cache_hit_rate{model_name="m",tp_rank="0"} 0.4
# EOF
"""


def test_vllm_sums_counts_and_averages_fractions():
    f = parse_metrics(VLLM)
    assert f["running"] == 5 and f["waiting"] == 4
    assert f["kv"] == 0.375
    t = Telemetry()
    apply(t, f, now=1.0)
    assert (t.running, t.waiting, t.scraped_at) == (5, 4, 1.0)
    # the hit rate comes from the change between two scrapes
    f2 = parse_metrics(VLLM.replace("1000.0", "2000.0").replace("250.0", "750.0"))
    apply(t, f2, now=2.0)
    assert t.prefix_hit_rate == 0.5


def test_legacy_vllm_kv_name_is_a_fallback():
    f = parse_metrics(
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\nvllm:num_requests_running 1\n'
    )
    t = Telemetry()
    apply(t, f, now=0.0)
    assert t.kv_usage == 0.9 and t.running == 1


def test_sglang_escaped_names():
    t = Telemetry()
    apply(t, parse_metrics(SGLANG_OPENMETRICS), now=0.0)
    assert (t.running, t.waiting, t.kv_usage, t.prefix_hit_rate) == (7, 1, 0.75, 0.4)


def test_garbage_is_ignored():
    f = parse_metrics(
        'vllm:num_requests_running{a="b"} notanumber\n\n#\nvllm:num_requests_waiting\n'
    )
    assert f == {}
