"""``make demo``: the whole cluster lifecycle on this machine, through the real code paths.

    make demo ARGS="[--workers N] [--fail-launches K] [--kill-node-after S] [--epochs E]
                    [--keep] [--report PATH] [--port P]"        (python -m emulator.demo ...)
    make demo ARGS="--stop <work dir>/state.json [--keep-files]"

moto plays AWS on localhost; the real CDK CLI deploys the stack to it; one emulated node
per instance the Auto Scaling groups launched (its own loopback address, metadata endpoint
and root directory, one shared directory as EFS) runs the node agent and job executor the
user data installs; the harness delivers the Auto Scaling notifications moto cannot send to
the real Lambda handler; then ``dl-run`` trains the example model across every node.
See docs/demo.md.

- :mod:`.cli`           options, their validation, ``main``
- :mod:`.context`       what one run knows (work dir, cloud, nodes, jobs) and its console output
- :mod:`.cluster`       bringing the cluster up: cloud, deploy, boot, notifications, membership
- :mod:`.joblog`        what is read from a job: its output lines and its share records on EFS
- :mod:`.scenarios`     what the demo plays and when: failed launches, a killed node, scaling
- :mod:`.report`        ``demo-report.json``, the summary table, the ``--keep`` instructions
- :mod:`.orchestration` the run from start to teardown, the training job, ``--stop``
- :mod:`.shell`         the ``--keep`` shell: README's commands work as written on the master
"""
