-- wrk script: POST /flags?v=2 as real traffic does it — a new distinct_id and varied person
-- properties in every request (users.lua). The first script argument is the repeated-body
-- file flags_setup.py writes; only its token is used. Run from the repository root.
dofile("benches/load/users.lua")
local token

function init(args)
  token = json_post_with_field_of(args[1], "token")
end

function request()
  local u = new_user()
  local body = string.format(
    '{"token":"%s","distinct_id":"%s","person_properties":{"email":"%s","plan":"%s",' ..
    '"age":%d,"country":"%s","$app_version":"%s"}}',
    token, u.id, u.email, u.plan, u.age, u.country, u.app_version)
  return wrk.format(nil, nil, nil, body)
end
