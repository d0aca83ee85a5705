-- wrk script: POST /api/frontend to Unleash Edge as real traffic does it — a new userId and
-- varied context properties in every request, drawn as for Corvid (users.lua). The first
-- script argument is the frontend token. Run from the repository root.
dofile("benches/load/users.lua")

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = args[1]
  math.randomseed(os.time())
end

function request()
  local u = new_user()
  local body = string.format(
    '{"userId":"%s","properties":{"email":"%s","plan":"%s","age":"%d","country":"%s",' ..
    '"appVersion":"%s"}}',
    u.id, u.email, u.plan, u.age, u.country, u.app_version)
  return wrk.format(nil, nil, nil, body)
end
