"""The optimizer: every speed-up of a Spark run is a named rule, decided here and nowhere else.

`book` holds the optimizer's book-keeping (`Env`, the facts of a run; `Work`, the plan being
optimized; `Rule`); the rules by concern, each rule's check, effect and summary together;
`optimizer` the order they are decided in (`RULES`) and the loop (`optimize`); `switches`
which rules a run switches on and the rules table. See docs/architecture.md, "How to add a rule".
"""
