"""Judges: what the broker stored (or would serve), judged as the broker users run would have
done it, where the broker under test does not. Shared by the chaos bench and tests/ (one
place, not a copy in each), never shipped with producerkit."""
