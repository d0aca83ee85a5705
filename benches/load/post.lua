-- wrk script: POSTs the file given as the first script argument; "gzip" as the second adds
-- Content-Encoding: gzip.
function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  if args[2] == "gzip" then
    wrk.headers["Content-Encoding"] = "gzip"
  end
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
