-- wrk script used by bench/overhead: sets the request from the environment and,
-- when wrk is done, writes a JSON summary with the latency quantile function to
-- $BENCH_OUT (this wrk build cannot hand the raw histogram to Lua, so the
-- distribution goes out as quantiles on a fine grid, finer in the tail).
--
-- BENCH_METHOD, BENCH_BODY, BENCH_CTYPE: the request (default: GET, no body).
-- BENCH_CLOSE=1: send `Connection: close`, so wrk opens a fresh connection per
-- request (wrk times from the request's write to the response's end, so the
-- TCP handshake itself is not counted).

local method = os.getenv("BENCH_METHOD")
if method and method ~= "" then wrk.method = method end
local body = os.getenv("BENCH_BODY")
if body and body ~= "" then wrk.body = body end
local ctype = os.getenv("BENCH_CTYPE")
if ctype and ctype ~= "" then wrk.headers["Content-Type"] = ctype end
if os.getenv("BENCH_CLOSE") == "1" then wrk.headers["Connection"] = "close" end

local function grid()
  local edges = {}
  for i = 0, 990 do edges[#edges + 1] = i / 10 end          -- 0.0 .. 99.0 by 0.1
  for i = 1, 90 do edges[#edges + 1] = 99 + i / 100 end     -- 99.01 .. 99.9 by 0.01
  for i = 1, 100 do edges[#edges + 1] = 99.9 + i / 1000 end -- 99.901 .. 100 by 0.001
  return edges
end

done = function(summary, latency, requests)
  local out = os.getenv("BENCH_OUT")
  if not out or out == "" then return end
  local f = assert(io.open(out, "w"))
  local e = summary.errors
  f:write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout))
  f:write(string.format('"min_us": %d, "max_us": %d, "mean_us": %.1f, "p50_us": %d, "p99_us": %d, "quantiles": [',
    latency.min, latency.max, latency.mean, latency:percentile(50), latency:percentile(99)))
  local edges = grid()
  for i = 1, #edges - 1 do
    local lo, hi = edges[i], edges[i + 1]
    if i > 1 then f:write(", ") end
    f:write(string.format("[%.3f, %.3f, %d]", lo, hi, latency:percentile((lo + hi) / 2)))
  end
  f:write("]}\n")
  f:close()
end
