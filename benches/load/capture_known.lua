-- wrk script: single events on /i/v0/e/ as a big customer's apps send them: half from known
-- users (known-<k>, k < KNOWN, seeded by known_persons.py) updating their plan with `$set`,
-- half from new users (capture_users.lua's events). Arguments: the single.json body
-- make_bodies.py writes (only its api_key is used), KNOWN. Run from the repository root.
dofile("benches/load/users.lua")
local token, known

function init(args)
  token = json_post_with_field_of(args[1], "api_key")
  known = tonumber(args[2])
end

function request()
  local u = new_user()
  local id = half_known(u, known)
  local body = string.format(
    '{"api_key":"%s","event":"$pageview","distinct_id":"%s","properties":{' ..
    '"$current_url":"https://shop.example.com/products/%d","$browser":"Chrome",' ..
    '"$os":"Mac OS X","$lib":"web","$app_version":"%s","plan":"%s","country":"%s",' ..
    '"$set":{"email":"%s","plan":"%s"}}}',
    token, id, u.age, u.app_version, u.plan, u.country, u.email, u.plan)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  report_errors(status, body)
end
