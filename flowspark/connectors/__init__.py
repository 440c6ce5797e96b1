"""Built-in connectors under their Bytewax module paths.

The connectors live in `flowspark.inputs` and `flowspark.outputs`; these modules
re-export them so code ported from `bytewax.connectors.files` /
`bytewax.connectors.stdio` only needs its package name changed.
"""
