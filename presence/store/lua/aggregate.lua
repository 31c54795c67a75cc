-- A connected user's aggregate (one hash field, field = user id, see CONNECTION):
-- "connections:web:mobile:desktop:active:page_web:page_mobile:page_desktop" -- live connections,
-- those of each device kind, the non-idle ones, and the time of the latest page view of each
-- device kind while connected (0: none). Parsed and written in O(1) whatever the connections.
-- Fields 2-4 (connections) and 6-8 (page views) of device bit b are 1 + slot(b), 5 + slot(b).
local AGGREGATE = '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$'
local function slot(b) return math.floor(b / 2) + 1 end
