"""The cluster's network: public + private subnets over two or more AZs, NAT, flow logs (in a
log group encrypted with a customer-managed, rotating KMS key).

Where the NAT gateways are: CDK's ``Vpc`` puts them in the public subnets in the VPC's zone
order (the first of ``availability_zones``, or of the region's), one per zone up to
``nat_gateways``; a private subnet routes through its own zone's NAT, or another zone's when
its zone has none. With the default one NAT, it is in the zone the single-zone cluster starts
in (``launch.zone_plan`` takes the same first zone). A zone move does not move it: the nodes
in the next zone then reach AWS through the first zone's NAT, billed per GB between zones and
cut off with that zone; ``nat_gateways`` = the zones gives every zone its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from constructs_lib import validation

#: CIDR block of a new VPC.
DEFAULT_VPC_CIDR = "10.0.0.0/16"
#: Availability zones of a new VPC (EFS and NAT resilience need at least 2).
DEFAULT_MAX_AZS = 2
#: NAT gateways of a new VPC (training traffic stays inside; NAT carries package installs and
#: the nodes' AWS calls other than S3's): one, in the first zone, the nodes' own by default.
DEFAULT_NAT_GATEWAYS = 1
#: Retention of a new VPC's flow logs.
DEFAULT_FLOW_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


class ClusterNetwork(Construct):
    """A VPC for a training cluster, or an existing one passed in as ``vpc``.

    A new VPC has one public and one private (egress via NAT) subnet per AZ and VPC flow logs
    of rejected and accepted traffic to CloudWatch Logs.

    The local emulator passes ``cidr="127.20.0.0/16"`` so moto hands instances loopback
    addresses (public subnets 127.20.0.0/18 + 127.20.64.0/18, private 127.20.128.0/18 +
    127.20.192.0/18).
    """

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc | None = None,
        cidr: str = DEFAULT_VPC_CIDR,
        max_azs: int = DEFAULT_MAX_AZS,
        nat_gateways: int = DEFAULT_NAT_GATEWAYS,
        flow_log_retention: logs.RetentionDays = DEFAULT_FLOW_LOG_RETENTION,
        availability_zones: Sequence[str] | None = None,
        s3_gateway_endpoint: bool = True,
    ) -> None:
        """
        :param vpc: an existing VPC to use; the other props then do not apply.
            :default: a new VPC
        :param cidr: CIDR block of the new VPC, a /16 to /24.
            :default: ``10.0.0.0/16``
        :param max_azs: availability zones of the new VPC, at least 2.
            :default: 2
        :param nat_gateways: NAT gateways of the new VPC, one per zone in the zones' order,
            at most one per zone (see the module's docstring).
            :default: 1
        :param flow_log_retention: how long the new VPC's flow logs are kept.
            :default: one month
        :param availability_zones: the new VPC's zones by name (at least 2), instead of
            ``max_azs`` (e.g. to include the zone of a Capacity Reservation).
            :default: the region's first ``max_azs`` zones
        :param s3_gateway_endpoint: give the new VPC an S3 gateway endpoint (routes in every
            subnet's route table), so datasets and checkpoints reach S3 without crossing the
            NAT gateway (no NAT data-processing charge, no NAT bandwidth limit). Gateway
            endpoints cost nothing (https://docs.aws.amazon.com/vpc/latest/privatelink/
            vpc-endpoints-s3.html). An existing ``vpc`` is left as it is.
            :default: True
        """
        super().__init__(scope, construct_id)
        self.s3_endpoint: ec2.GatewayVpcEndpoint | None = None
        if vpc is not None:
            self.vpc: ec2.IVpc = vpc
            self.flow_log_group: logs.ILogGroup | None = None
            self.flow_log_key: kms.IKey | None = None
            return
        validation.vpc_cidr("cidr", cidr)
        if max_azs < 2:
            raise validation.ConfigError(
                f"max_azs must be >= 2 (EFS and NAT resilience), got {max_azs}"
            )
        zones: dict = {"max_azs": max_azs}
        if availability_zones:
            names = validation.availability_zones("availability_zones", availability_zones)
            if len(names) < 2:
                raise validation.ConfigError(
                    f"availability_zones must name at least 2 zones (EFS and NAT resilience), "
                    f"got {list(names)}")
            zones = {"availability_zones": list(names)}
        zone_count = len(zones.get("availability_zones") or ()) or max_azs
        validation.count("nat_gateways", nat_gateways, minimum=1, maximum=zone_count)
        self.flow_log_key = flow_log_key(self)
        self.flow_log_group = logs.LogGroup(
            self, "FlowLogs", retention=flow_log_retention, removal_policy=RemovalPolicy.DESTROY,
            encryption_key=self.flow_log_key,
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            **zones,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC),
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
                ),
            ],
            flow_logs={
                "all": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        if s3_gateway_endpoint:
            self.s3_endpoint = self.vpc.add_gateway_endpoint(
                "S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3)


def flow_log_key(scope: Construct) -> kms.Key:
    """The flow logs' key: CloudWatch Logs may use it for this account's log groups in this
    region only (the encryption context names the log group; AWS's key policy for log
    groups: https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html).
    The context key is a String (StringLike), present only on the cryptographic calls."""
    key = kms.Key(scope, "FlowLogKey", enable_key_rotation=True,
                  removal_policy=RemovalPolicy.DESTROY,
                  description="Encrypts the cluster VPC's flow logs")
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="CloudWatchLogsEncryptsFlowLogs",
        principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
        actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
        resources=["*"],
        conditions={"StringLike": {"kms:EncryptionContext:aws:logs:arn": (
            f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*")}}))
    return key


def node_security_groups(scope: Construct, vpc: ec2.IVpc, ssh_cidr: str | None
                         ) -> tuple[ec2.SecurityGroup, ec2.SecurityGroup | None]:
    """The nodes' group (all traffic between nodes, nothing else in) and, with ``ssh_cidr``,
    the master's extra group admitting SSH from that range only."""
    nodes = ec2.SecurityGroup(
        scope,
        "NodeSecurityGroup",
        vpc=vpc,
        allow_all_outbound=True,
        description="Cluster nodes: all traffic between nodes (NCCL, MPI, rendezvous)",
    )
    nodes.add_ingress_rule(nodes, ec2.Port.all_traffic(), "all traffic between cluster nodes")
    if not ssh_cidr:
        return nodes, None
    admin = ec2.SecurityGroup(
        scope,
        "AdminSsh",
        vpc=vpc,
        allow_all_outbound=False,
        description=f"SSH to the master from {ssh_cidr} only",
    )
    admin.add_ingress_rule(
        ec2.Peer.ipv4(ssh_cidr), ec2.Port.tcp(22), "SSH from the administrators' range")
    return nodes, admin
