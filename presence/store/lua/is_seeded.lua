-- KEYS[1] a shard's ``:seeded`` marker (its "invisible" set's; see LEDGER). 1 when its copy of
-- the choices was seeded from the database by this run of the server, else 0 (lua/ledger.lua's
-- ``seeded``; seed_ledger.lua).
return seeded(KEYS[1]) and 1 or 0
