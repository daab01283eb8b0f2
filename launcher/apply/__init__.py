"""What changes the ranks: node preparation (prep), the serving containers (serve), and `up` /
`down` (deploy), which runs check, build, ship and serve in order.

May import every folder beneath it (check, plan, images, transport, inputs, facts); never bench or
cli.
"""
