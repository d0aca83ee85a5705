-- wrk script: flags_users.lua (a new user per request) plus a pause between each
-- connection's requests, to hold a rate (about connections / (pause + latency)) below
-- saturation and read the latency there. The first script argument is the pause in
-- milliseconds (whole milliseconds: wrk's timer resolution); the second is flags_users.lua's.
dofile("benches/load/flags_users.lua")

local pause_ms = 0
local users_init = init

function init(args)
  pause_ms = tonumber(args[1])
  users_init({ args[2] })
end

function delay()
  return pause_ms
end
