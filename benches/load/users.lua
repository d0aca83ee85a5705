-- Shared by flags_users.lua and edge_users.lua: the fields of one new user per request, drawn
-- the same way for both servers (country, email, plan, age, app version, sign-up time).
local countries = {"US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"}
local domains = {"corp.com", "gmail.com", "example.org", "mail.de", "shop.io"}
local plans = {"free", "pro", "enterprise", "trial"}
local counter = 0

function new_user()
  counter = counter + 1
  local n = math.random(1, 1000000000)
  return {
    id = string.format("user-%d-%d", counter, n),
    email = string.format("u%d@%s", n, domains[n % #domains + 1]),
    plan = plans[n % #plans + 1],
    age = 16 + n % 60,
    country = countries[n % #countries + 1],
    app_version = string.format("2.%d.%d", n % 10, n % 7),
    signed_up_at = os.date("!%Y-%m-%dT%H:%M:%SZ", 1735689600 + (n % 16000) * 3600),
  }
end

-- The id of a request: half the time one of the `known` seeded persons (known-<k>,
-- known_persons.py), else the new user's own.
function half_known(u, known)
  if math.random() < 0.5 then
    return string.format("known-%d", math.random(0, known - 1))
  end
  return u.id
end

-- Sets up a JSON POST and returns the string field `name` of the JSON file at `path` (the
-- project token of the body files the setup scripts write).
function json_post_with_field_of(path, name)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  math.randomseed(os.time())
  return string.match(text, '"' .. name .. '": *"([^"]+)"')
end

-- Prints the body of an answer that is not 200. Only the capture scripts use it: the flag
-- scripts define no `response` hook, because with one wrk copies every answer into Lua (a
-- 300-flag answer is ~68 KB) on the two cores the server shares; their scripts count failed
-- answers from wrk's own "Non-2xx or 3xx responses" line instead.
function report_errors(status, body)
  if status ~= 200 then
    io.stderr:write("unexpected status " .. status .. ": " .. body .. "\n")
  end
end
