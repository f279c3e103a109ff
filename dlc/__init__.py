"""``dlc``: run a deep-learning cluster from your laptop, through AWS APIs only.

CloudFormation (the stack), Auto Scaling and EC2 (the nodes), SSM Run Command (the master's
own ``dl-health`` / ``dl-jobs`` / ``dl-run`` / ``dl-scale``), SSM Session Manager (shells and
port forwarding) and the Price List API (cost). docs/dlc.md describes every command.
"""
