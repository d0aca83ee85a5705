-- wrk script: POST /flags?v=2 as group-analytics traffic does it — a new distinct_id, varied
-- person properties and a company (one of 100,000, with its industry and size) in every
-- request. The first script argument is the body file `flags_setup.py ... groups` writes;
-- only its token is used. Run from the repository root.
dofile("benches/load/users.lua")
local token
local industries = {"saas", "retail", "finance", "health", "media"}

function init(args)
  token = json_post_with_field_of(args[1], "token")
end

function request()
  local u = new_user()
  local company = math.random(1, 100000)
  local body = string.format(
    '{"token":"%s","distinct_id":"%s","person_properties":{"email":"%s","plan":"%s",' ..
    '"age":%d,"country":"%s","$app_version":"%s"},"groups":{"company":"company-%d"},' ..
    '"group_properties":{"company":{"industry":"%s","employees":%d}}}',
    token, u.id, u.email, u.plan, u.age, u.country, u.app_version, company,
    industries[company % #industries + 1], company % 500)
  return wrk.format(nil, nil, nil, body)
end
