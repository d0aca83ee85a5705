-- wrk script: POST /flags?v=2 as real traffic does it — a new distinct_id and varied person
-- properties (country, email, plan, age, app version) in every request. The first script
-- argument is the repeated-body file flags_setup.py writes; only its token is used.
local token
local countries = {"US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"}
local domains = {"corp.com", "gmail.com", "example.org", "mail.de", "shop.io"}
local plans = {"free", "pro", "enterprise", "trial"}
local counter = 0

function init(args)
  local f = assert(io.open(args[1], "rb"))
  local text = f:read("*a")
  f:close()
  token = string.match(text, '"token": *"([^"]+)"')
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  math.randomseed(os.time())
end

function request()
  counter = counter + 1
  local n = math.random(1, 1000000000)
  local body = string.format(
    '{"token":"%s","distinct_id":"user-%d-%d","person_properties":{"email":"u%d@%s",' ..
    '"plan":"%s","age":%d,"country":"%s","$app_version":"2.%d.%d"}}',
    token, counter, n, n, domains[n % #domains + 1], plans[n % #plans + 1], 16 + n % 60,
    countries[n % #countries + 1], n % 10, n % 7)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
