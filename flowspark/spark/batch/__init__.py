"""The batch lowering: a physical plan run as Spark batch jobs (every source bounded).

`job` builds and runs the jobs (`run_batch`); `native` the Spark aggregates of the stages the
rule `native_reduction` chose; `driverprefix` the driver-side read of the rule `driver_prefix`;
`describe` what each stage lowers to, in words (`flowspark plan --spark`).
"""
