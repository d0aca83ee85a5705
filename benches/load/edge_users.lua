-- wrk script: POST /api/frontend to Unleash Edge as real traffic does it — a new userId and
-- varied context properties (the same kinds of values flags_users.lua sends to Corvid). The
-- first script argument is the frontend token.
local countries = {"US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"}
local domains = {"corp.com", "gmail.com", "example.org", "mail.de", "shop.io"}
local plans = {"free", "pro", "enterprise", "trial"}
local counter = 0

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = args[1]
  math.randomseed(os.time())
end

function request()
  counter = counter + 1
  local n = math.random(1, 1000000000)
  local body = string.format(
    '{"userId":"user-%d-%d","properties":{"email":"u%d@%s","plan":"%s","age":"%d",' ..
    '"country":"%s","appVersion":"2.%d.%d"}}',
    counter, n, n, domains[n % #domains + 1], plans[n % #plans + 1], 16 + n % 60,
    countries[n % #countries + 1], n % 10, n % 7)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
