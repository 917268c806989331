-- Fixed-count load for wrk (Debian package `wrk`), driven by bench/gateway_overhead.py.
-- Adapted from the team's shared harness (../shared/bench/loadgen.lua).
--
-- Every connection POSTs /v1/chat/completions, waits for the whole answer (for a stream:
-- through `data: [DONE]`), then sends the next one: a closed loop. With BENCH_THINK_MS > 0
-- a connection first waits an exponentially distributed pause of that mean (wrk's
-- `delay()`; the pause is not part of the measured latency), so the load is below
-- saturation. The run stops after exactly BENCH_REQUESTS answers and prints one line
-- starting with "BENCH " holding JSON. Run with ONE thread (-t1) so the count is exact:
--
--   BENCH_REQUESTS=3000 BENCH_STREAM=1 wrk -t1 -c16 -d60s --timeout 30s \
--     -s bench/loadgen.lua http://127.0.0.1:8080/v1/chat/completions
--
-- An answer is bad unless it is HTTP 200 and holds '"choices"' (non-streaming) or
-- 'data: [DONE]' (streaming). Latency = request written to last byte of the answer.
-- Linux + glibc (tgkill) and wrk's LuaJIT (ffi) for the early stop; without ffi the run
-- lasts the whole -d.

local total = tonumber(os.getenv("BENCH_REQUESTS") or "3000")
local stream = os.getenv("BENCH_STREAM") == "1"
local model = os.getenv("BENCH_MODEL") or "mock"
local think_ms = tonumber(os.getenv("BENCH_THINK_MS") or "0")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.body = string.format(
  '{"model":"%s","messages":[{"role":"user","content":"Say hello in one short sentence."}],' ..
  '"max_tokens":20,"temperature":0,"stream":%s}', model, stream and "true" or "false")

-- wrk's main thread sleeps for the whole -d; after the last answer we send SIGINT to that
-- thread (its id is the process id), which wrk takes as "stop now": the run ends at once
-- and summary.duration is the real run time.
local ok, ffi = pcall(require, "ffi")
if ok then
  ffi.cdef[[ int getpid(void); int tgkill(int tgid, int tid, int sig); ]]
end
local function end_run()
  if ok then
    local pid = ffi.C.getpid()
    ffi.C.tgkill(pid, pid, 2)
  end
end

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

if think_ms > 0 then
  -- defined only when wanted: wrk checks once whether the script has a delay()
  function delay()
    return -math.log(1 - math.random()) * think_ms
  end
end

count = 0 -- globals, so that done() can read them with thread:get()
bad = 0
local want = stream and "data: [DONE]" or '"choices"'

function response(status, headers, body)
  count = count + 1
  if status ~= 200 or not string.find(body, want, 1, true) then
    bad = bad + 1
  end
  if count == total then
    wrk.thread:stop()
    end_run()
  end
end

function done(summary, latency, requests)
  local nbad, ncount = 0, 0
  for _, t in ipairs(threads) do
    nbad = nbad + t:get("bad")
    ncount = ncount + t:get("count")
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"mean_us":%.1f,"max_us":%d,"bad":%d,"err_connect":%d,"err_read":%d,' ..
    '"err_write":%d,"err_timeout":%d,"err_status":%d}\n',
    ncount, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max, nbad, e.connect, e.read,
    e.write, e.timeout, e.status))
end
