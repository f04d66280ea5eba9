"""The load generator: prompts and schedules, the streaming client, its workers, its self-test instrument."""
