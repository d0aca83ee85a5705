-- wrk script: POSTs gzipped /batch/ bodies in turn from the files make_batch_bodies.py writes.
-- Script arguments: the bodies file (batches.bin) and its index (batches.idx). Each wrk thread
-- starts at a random body, so threads do not send the same body at once. Run from the
-- repository root.
dofile("benches/load/users.lua")
local bodies = {}
local next_body = 1

function init(args)
  local data = assert(io.open(args[1], "rb")):read("*a")
  local at = 1
  for size in assert(io.open(args[2], "r")):lines() do
    local n = tonumber(size)
    bodies[#bodies + 1] = string.sub(data, at, at + n - 1)
    at = at + n
  end
  math.randomseed(os.time() + (tonumber(tostring({}):match("0x(%x+)"), 16) or 0) % 1000)
  next_body = math.random(1, #bodies)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Content-Encoding"] = "gzip"
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  report_errors(status, body)
end
