"""Slurm on the cluster's nodes (``scheduler=slurm``): what runs on the nodes, no CDK.

- :mod:`.names`: a node's Slurm name and features (the EC2 host-name form of its address);
- :mod:`.config`: the renderers of slurm.conf, gres.conf and cgroup.conf (pure);
- :mod:`.munge_key`: the cluster's munge key written where munged reads it (root);
- :mod:`.daemons`: munged, slurmctld and slurmd started from the node's files (the units'
  ``ExecStart``);
- :mod:`.reconcile`: the signed membership against Slurm's node list (a pure table) and the
  ``scontrol`` calls that apply it;
- :mod:`.node`: what the node agent does with them when it applies a membership.

docs/slurm-node.md says how it is proven with the real daemons.
"""
