"""What changes the ranks: node preparation (prep), the serving containers (serve), and `up` /
`down` (deploy), which gathers, plans, judges (check's rows), then builds, ships and serves in
order.

May import every folder beneath it (check, plan, gather, images, transport, inputs, facts); never
bench or cli.
"""
