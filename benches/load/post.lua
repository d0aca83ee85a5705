-- wrk script: POSTs the file given as the first script argument. Further arguments:
-- "gzip" adds Content-Encoding: gzip; "bearer=<token>" adds Authorization: Bearer <token>.
function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  for i = 2, #args do
    if args[i] == "gzip" then
      wrk.headers["Content-Encoding"] = "gzip"
    elseif string.sub(args[i], 1, 7) == "bearer=" then
      wrk.headers["Authorization"] = "Bearer " .. string.sub(args[i], 8)
    end
  end
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
