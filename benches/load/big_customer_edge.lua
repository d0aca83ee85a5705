-- wrk script: POST /api/frontend to Unleash Edge with big_customer.lua's users, each request
-- carrying every property (Edge has no store: its best case); half the user ids are known-<k>
-- (k < KNOWN) so the static-cohort flags match as in Corvid. The requests are built before
-- the run, as for Corvid (pooled.lua; POOL of them).
-- Arguments: the frontend token, KNOWN. Run from the repository root.
dofile("benches/load/users.lua")
dofile("benches/load/pooled.lua")

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = args[1]
  local known = tonumber(args[2])
  math.randomseed(os.time())
  build_requests(function()
    local u = new_user()
    local id = half_known(u, known)
    return string.format(
      '{"userId":"%s","properties":{"email":"%s","plan":"%s","age":"%d","country":"%s",' ..
      '"appVersion":"%s","signedUpAt":"%s"}}',
      id, u.email, u.plan, u.age, u.country, u.app_version, u.signed_up_at)
  end)
end
