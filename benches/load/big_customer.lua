-- wrk script: POST /flags?v=2 as a big customer's traffic: half the requests from known users
-- (known-<k>, k < KNOWN, seeded by known_persons.py) sending only their country, the other
-- half from new users sending every property the flags read (users.lua). The requests are
-- built before the run (pooled.lua; POOL of them).
-- Arguments: the body file flags_setup.py-style (only its token is used), KNOWN.
-- Run from the repository root.
dofile("benches/load/users.lua")
dofile("benches/load/pooled.lua")
local countries = {"US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"}

function init(args)
  local token = json_post_with_field_of(args[1], "token")
  local known = tonumber(args[2])
  build_requests(function()
    if math.random() < 0.5 then
      local k = math.random(0, known - 1)
      return string.format(
        '{"token":"%s","distinct_id":"known-%d","person_properties":{"country":"%s"}}',
        token, k, countries[k % 10 + 1])
    end
    local u = new_user()
    return string.format(
      '{"token":"%s","distinct_id":"%s","person_properties":{"email":"%s","plan":"%s",' ..
      '"age":%d,"country":"%s","app_version":"%s","signed_up_at":"%s"}}',
      token, u.id, u.email, u.plan, u.age, u.country, u.app_version, u.signed_up_at)
  end)
end
