-- wrk script: single events on /i/v0/e/ as real traffic sends them — a new distinct_id and
-- varied properties in every request (users.lua). The first script argument is the
-- single.json body make_bodies.py writes; only its api_key is used. Run from the repository
-- root.
dofile("benches/load/users.lua")
local token

function init(args)
  token = json_post_with_field_of(args[1], "api_key")
end

function request()
  local u = new_user()
  local body = string.format(
    '{"api_key":"%s","event":"$pageview","distinct_id":"%s","properties":{' ..
    '"$current_url":"https://shop.example.com/products/%d","$browser":"Chrome",' ..
    '"$os":"Mac OS X","$lib":"web","$app_version":"%s","plan":"%s","country":"%s",' ..
    '"$set":{"email":"%s","plan":"%s"}}}',
    token, u.id, u.age, u.app_version, u.plan, u.country, u.email, u.plan)
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  report_errors(status, body)
end
