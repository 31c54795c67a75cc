-- KEYS[1] an outbox (see outbox.lua); ARGV[1] the newest score to claim, ARGV[2] at most how
-- many. Claims the transitions left unclaimed since then: removes and returns them.
return claim(KEYS[1], ARGV[1], ARGV[2])
