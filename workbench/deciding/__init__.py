"""Deciding between configurations under noise: alternating rounds of trials, interleaved turns in one
process, the budget of seconds every verb spends, and the warning before a hopeless trial."""
