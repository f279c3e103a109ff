"""The stack's side of Slurm (``scheduler=slurm``): the cluster's munge key.

Every Slurm daemon and client of a cluster proves who it is with a munge credential, and
munge trusts whoever holds the cluster's one shared key: a process with the key can forge
any user's identity to slurmctld and slurmd (run a job as root on every node). So the key is

- made at deploy, one per cluster, by Secrets Manager itself (``GenerateSecretString``): no
  person, no CI log and no template ever holds its bytes;
- long: munge needs at least 32 bytes; 1,024 characters of Secrets Manager's generator
  (letters, digits and punctuation, about 6.5 bits each) are far above it;
- encrypted with a customer-managed KMS key of the cluster (:class:`MungeKey` makes one,
  rotating, unless it is given one), so reading it needs ``kms:Decrypt`` through Secrets
  Manager as well as ``secretsmanager:GetSecretValue``;
- readable by the node roles alone (:meth:`MungeKey.grant_read`: the master's and the
  workers'; the node agent, as root, fetches it and writes it 0400 to the node's local disk,
  never to EFS). No operator policy names it; jobs get the job role's credentials, never the
  node's (docs/security.md).

Removal: DESTROY, for the secret and its key. The munge key authenticates the cluster's live
daemons to each other and to nothing else; munge credentials expire within minutes, and
nothing the cluster stores (slurmctld's state, accounting, checkpoints) is encrypted with it.
A new stack is a new cluster with a new key; keeping the old one would only keep a secret
that nothing can use. Secrets Manager still keeps a deleted secret for its recovery window.
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from constructs_lib import validation

#: Characters of the generated munge key (munge needs >= 32 bytes; GenerateSecretString's
#: ``PasswordLength`` may be up to 4,096).
MUNGE_KEY_CHARACTERS = 1024
#: Fewest characters accepted: munge refuses a key shorter than 32 bytes.
MIN_MUNGE_KEY_CHARACTERS = 32
#: Most characters Secrets Manager generates.
MAX_MUNGE_KEY_CHARACTERS = 4096


class MungeKey(Construct):
    """One cluster's munge key in Secrets Manager; :meth:`grant_read` to the node roles."""

    @validation.reports_path
    def __init__(self, scope: Construct, construct_id: str, *,
                 encryption_key: kms.IKey | None = None,
                 length: int = MUNGE_KEY_CHARACTERS,
                 removal_policy: RemovalPolicy = RemovalPolicy.DESTROY) -> None:
        """
        :param encryption_key: the cluster's customer-managed key to encrypt the secret with;
            its key policy must let the account's IAM policies grant ``kms:Decrypt`` (the
            default key policy does).
            :default: a new symmetric key with yearly rotation, for this secret alone
        :param length: characters of the generated key (32 to 4,096).
            :default: 1024
        :param removal_policy: what happens to the secret (and a key made here) when the
            stack is deleted.
            :default: ``RemovalPolicy.DESTROY`` (a new stack is a new cluster, with a new key)
        """
        super().__init__(scope, construct_id)
        length = validation.count("length", length, minimum=MIN_MUNGE_KEY_CHARACTERS,
                                  maximum=MAX_MUNGE_KEY_CHARACTERS)
        #: The KMS key the secret is encrypted with.
        self.encryption_key: kms.IKey = encryption_key or kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=removal_policy,
            description="Encrypts the cluster's munge key (Slurm's authentication)")
        #: The secret; its value is the key's bytes as text, no JSON around it.
        self.secret = secretsmanager.Secret(
            self, "Secret", encryption_key=self.encryption_key,
            description="The cluster's munge key: Slurm's daemons authenticate with it "
            "(read by the node roles only)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=length, include_space=False),
            removal_policy=removal_policy)

    @property
    def secret_arn(self) -> str:
        """The secret's ARN (the nodes' ``--munge-key-secret``)."""
        return self.secret.secret_arn

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """``grantee`` may read the key's value and nothing else: ``GetSecretValue`` on this
        secret, and ``kms:Decrypt`` on its key only through Secrets Manager for this secret
        (the encryption context Secrets Manager sets names the secret's ARN)."""
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=["secretsmanager:GetSecretValue"],
            resource_arns=[self.secret_arn])
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["kms:Decrypt"], resources=[self.encryption_key.key_arn],
            conditions={"StringEquals": {
                "kms:ViaService": f"secretsmanager.{Aws.REGION}.amazonaws.com",
                "kms:EncryptionContext:SecretARN": self.secret_arn}}))
        return grant
