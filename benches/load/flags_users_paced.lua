-- wrk script: flags_users.lua (a new user per request; or the script the environment's
-- USERS_LUA names, e.g. flags_groups.lua) plus a pause between each connection's requests, to
-- hold a rate (about connections / (pause + latency)) below saturation and read the latency
-- there. The first script argument is the pause in milliseconds (whole milliseconds: wrk's
-- timer resolution); the second is the users script's.
dofile(os.getenv("USERS_LUA") or "benches/load/flags_users.lua")

local pause_ms = 0
local users_init = init

function init(args)
  pause_ms = tonumber(args[1])
  users_init({ args[2] })
end

function delay()
  return pause_ms
end
