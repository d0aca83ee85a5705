-- wrk script: POST /api/frontend to Unleash Edge with big_customer.lua's users, each request
-- carrying every property (Edge has no store: its best case); half the user ids are known-<k>
-- (k < KNOWN) so the static-cohort flags match as in Corvid.
-- Arguments: the frontend token, KNOWN. Run from the repository root.
dofile("benches/load/users.lua")
local known

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = args[1]
  known = tonumber(args[2])
  math.randomseed(os.time())
end

function request()
  local u = new_user()
  local id = half_known(u, known)
  local body = string.format(
    '{"userId":"%s","properties":{"email":"%s","plan":"%s","age":"%d","country":"%s",' ..
    '"appVersion":"%s","signedUpAt":"%s"}}',
    id, u.email, u.plan, u.age, u.country, u.app_version, u.signed_up_at)
  return wrk.format(nil, nil, nil, body)
end
