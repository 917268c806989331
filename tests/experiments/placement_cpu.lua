-- Fixed-count closed-loop load for wrk, the body read from a file (tests/experiments/
-- placement_cpu.py). bench/loadgen.lua's loop with BENCH_BODY (a JSON file) as the body:
--
--   BENCH_REQUESTS=3000 BENCH_BODY=body.json wrk -t1 -c8 -d120s -s placement_cpu.lua URL
--
-- Non-streaming; an answer is bad unless it is HTTP 200 and holds '"choices"'. One thread,
-- so the count is exact; after the last answer wrk's main thread gets SIGINT (LuaJIT ffi).

local total = tonumber(os.getenv("BENCH_REQUESTS") or "3000")
local f = assert(io.open(assert(os.getenv("BENCH_BODY"), "BENCH_BODY: a body file"), "rb"))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = f:read("*a")
f:close()

local ok, ffi = pcall(require, "ffi")
if ok then
  ffi.cdef[[ int getpid(void); int tgkill(int tgid, int tid, int sig); ]]
end

local threads = {}
function setup(thread)
  table.insert(threads, thread)
end

count = 0
bad = 0

function response(status, headers, body)
  count = count + 1
  if status ~= 200 or not string.find(body, '"choices"', 1, true) then
    bad = bad + 1
  end
  if count == total then
    wrk.thread:stop()
    if ok then
      local pid = ffi.C.getpid()
      ffi.C.tgkill(pid, pid, 2)
    end
  end
end

function done(summary, latency, requests)
  local nbad, ncount = 0, 0
  for _, t in ipairs(threads) do
    nbad = nbad + t:get("bad")
    ncount = ncount + t:get("count")
  end
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"bad":%d}\n',
    ncount, summary.duration, latency:percentile(50), latency:percentile(99), nbad))
end
