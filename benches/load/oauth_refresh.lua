-- wrk script: refresh-token grants with rotation. The first argument is a file of refresh
-- tokens (one per connection); every answer's new refresh token goes back in the pool, so each
-- token is presented exactly once (a reuse would revoke its grant). Run with -t1: the pool is
-- per wrk thread.
local pool = {}
local client_id = ""

local function urlencode(s)
  return (s:gsub("[^%w%-_%.~]", function(c) return string.format("%%%02X", string.byte(c)) end))
end

function init(args)
  for line in io.lines(args[1]) do
    table.insert(pool, line)
  end
  client_id = urlencode(args[2])
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
end

-- wrk calls request() once per thread before any connection sends (to check the request); a
-- token taken then would never be sent, so that first call gets a placeholder.
local primed = false

function request()
  if not primed then
    primed = true
    return wrk.format(nil, nil, nil, "grant_type=refresh_token&refresh_token=placeholder")
  end
  local token = table.remove(pool)
  if token == nil then
    io.stderr:write("refresh token pool ran dry\n")
    token = "none"
  end
  return wrk.format(nil, nil, nil, "grant_type=refresh_token&client_id=" .. client_id .. "&refresh_token=" .. token)
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
    return
  end
  local token = body:match('"refresh_token":"([^"]+)"')
  if token ~= nil then
    table.insert(pool, token)
  end
end
