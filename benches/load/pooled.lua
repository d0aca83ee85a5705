-- Shared by big_customer.lua and big_customer_edge.lua: every request of the run is built
-- before it starts. wrk times only the run, so sending a request then costs wrk about what it
-- costs without a script (as in the /_health run beside it); building one in Lua as it goes
-- took wrk several µs a request on the two cores the server shares, counted against the server.
-- Each built request is different (a new user's id, or a known user drawn at random), so
-- no body repeats unless the run sends more than POOL (default 1,000,000); then it starts
-- over from the first and done() says so on stderr.
-- WRK_INIT_CPU (optional): a file that gets the CPU seconds the building took, so that
-- lib.sh's wrk_share counts the run alone.
local pool_size = tonumber(os.getenv("POOL") or "1000000")
local pool, sent = {}, 0

-- Builds the run's requests; make() returns one request's body.
function build_requests(make)
  for j = 1, pool_size do
    pool[j] = wrk.format(nil, nil, nil, make())
  end
  local path = os.getenv("WRK_INIT_CPU")
  if path then
    local f = assert(io.open(path, "w"))
    f:write(string.format("%.3f\n", os.clock()))
    f:close()
  end
end

-- The next built request.
function request()
  sent = sent + 1
  return pool[(sent - 1) % pool_size + 1]
end

function done(summary)
  if summary.requests > pool_size then
    io.stderr:write(string.format(
      "%d requests sent from %d built: some bodies were sent twice (raise POOL)\n",
      summary.requests, pool_size))
  end
end
