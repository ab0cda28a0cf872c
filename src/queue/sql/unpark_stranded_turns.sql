-- unpark_stranded_turns: maintenance's repair (docs/design.md §3 "Parked turns"): unparks up to
-- $1 parked turns whose tenants have orders to hand out, left so when one statement created
-- orders of more than 64 tenants while a claim parked one of them (pullman_unpark_turns, the
-- migration parked_turns). Usually none.
-- $1 most turns unparked (int)
-- Returns how many turns it unparked.
SELECT pullman_unpark_stranded_turns($1::int) AS unparked
