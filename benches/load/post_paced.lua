-- wrk script: post.lua plus a pause between each connection's requests, to hold a target rate
-- (about connections / (pause + latency)) instead of saturating the server. The first script
-- argument is the pause in milliseconds; the rest are post.lua's.
-- (wrk decides whether a script paces from the main script, so this is a separate file.)
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
dofile(here .. "post.lua")

local pause_ms = 0
local post_init = init

function init(args)
  pause_ms = tonumber(args[1])
  local rest = {}
  for i = 2, #args do
    rest[#rest + 1] = args[i]
  end
  post_init(rest)
end

function delay()
  return pause_ms
end
