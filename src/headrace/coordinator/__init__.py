"""The coordinator (seed 004): adapter client, sessions, prepare / set_portal / declare / execute."""
