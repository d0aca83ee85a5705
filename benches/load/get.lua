-- wrk script: GET with an optional bearer token (first script argument) and a status check.
function init(args)
  if args[1] ~= nil and args[1] ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. args[1]
  end
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
