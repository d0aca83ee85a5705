-- wrk script: POSTs the file given as the first script argument with the bearer token given as
-- the second (endpoint runs).
function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[2]
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
