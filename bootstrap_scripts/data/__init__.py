"""Data in S3 on the nodes: staging a prefix onto local disk before a job (``stage``)."""
