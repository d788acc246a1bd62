"""TLS: AMQP over TLS (amqps) through pika, client-certificate verification, the management API over
HTTPS through requests, and the broker's answers to clients that do not speak TLS, with a
throwaway CA and certificates that the `openssl` command line makes for each run."""

import os
import socket
import ssl
import subprocess
import time

import pika
import pytest
import requests

pytestmark = pytest.mark.lepus_only("starts Lepus brokers with TLS settings; the reference node has no TLS listener")

from conftest import HTTP_TIMEOUT_S, Lepus, free_port, lepus_binary, unique

# How a refused TLS client fails in pika: the TLS error itself when the handshake fails, a lost
# connection when TLS 1.3 lets the client finish its side before the server refuses its certificate.
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)

OPENSSL_CONFIG = """
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class Certificates:
    """A CA, a server certificate for 127.0.0.1 and localhost, a client certificate from that CA,
    and a client certificate from another CA, as PEM files in one directory."""

    def __init__(self, directory):
        self.directory = directory
        self.config = self.path("openssl.cnf")
        with open(self.config, "w") as file:
            file.write(OPENSSL_CONFIG)
        self.ca, self.ca_key = self.make_ca("ca", "Lepus test CA")
        # The server's key is RSA, the clients' are ECDSA P-256: rustls reads both.
        self.server, self.server_key = self.make_leaf("server", "localhost", "server_ext", self.ca, self.ca_key, ["rsa:2048"])
        self.client, self.client_key = self.make_leaf("client", "lepus-client", "client_ext", self.ca, self.ca_key)
        other_ca, other_ca_key = self.make_ca("other-ca", "Another CA")
        self.stranger, self.stranger_key = self.make_leaf("stranger", "lepus-client", "client_ext", other_ca, other_ca_key)

    def path(self, name):
        return os.path.join(self.directory, name)

    def openssl(self, *arguments):
        subprocess.run(["openssl", *arguments], check=True, capture_output=True, timeout=60)

    def make_ca(self, name, common_name):
        key, certificate = self.path(name + ".key"), self.path(name + ".pem")
        self.openssl("req", "-x509", "-config", self.config, "-extensions", "ca_ext", "-newkey", "ec", "-pkeyopt",
                     "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=" + common_name)
        return certificate, key

    def make_leaf(self, name, common_name, extensions, ca, ca_key, key_type=("ec", "-pkeyopt", "ec_paramgen_curve:P-256")):
        key, request, certificate = self.path(name + ".key"), self.path(name + ".csr"), self.path(name + ".pem")
        self.openssl("req", "-new", "-config", self.config, "-newkey", *key_type, "-nodes", "-keyout", key, "-out", request,
                     "-subj", "/O=Lepus tests/CN=" + common_name)
        self.openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", certificate, "-days", "2",
                     "-extfile", self.config, "-extensions", extensions)
        return certificate, key


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return Certificates(str(tmp_path_factory.mktemp("tls-certificates")))


class TlsLepus(Lepus):
    """A broker with the AMQPS and HTTPS listeners on free ports."""

    def __init__(self, binary, data_dir, certificates, extra_args=()):
        self.amqps_port, self.https_port = free_port(), free_port()
        self.certificates = certificates
        super().__init__(binary, data_dir, ["--amqps-port", str(self.amqps_port), "--https-port", str(self.https_port),
                                            "--tls-cert-file", certificates.server, "--tls-key-file", certificates.server_key,
                                            *extra_args])
        self.https_api = "https://127.0.0.1:%d/api" % self.https_port

    def tls_context(self, certificate=None, key=None, maximum_version=None):
        context = ssl.create_default_context(cafile=self.certificates.ca)
        if certificate:
            context.load_cert_chain(certificate, key)
        if maximum_version:
            context.maximum_version = maximum_version
        return context

    def connect_tls(self, context=None, server_hostname="localhost"):
        params = pika.ConnectionParameters("127.0.0.1", self.amqps_port, credentials=pika.PlainCredentials("guest", "guest"),
                                           ssl_options=pika.SSLOptions(context or self.tls_context(), server_hostname),
                                           socket_timeout=5, stack_timeout=10, blocked_connection_timeout=10, connection_attempts=1)
        return pika.BlockingConnection(params)


def start(tmp_path_factory, certificates, *extra_args):
    return TlsLepus(lepus_binary(), tmp_path_factory.mktemp("lepus-tls") / "data", certificates, extra_args)


@pytest.fixture(scope="module")
def tls_lepus(tmp_path_factory, certificates):
    broker = start(tmp_path_factory, certificates, "--tls-ca-file", certificates.ca)
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def verifying_lepus(tmp_path_factory, certificates):
    broker = start(tmp_path_factory, certificates, "--tls-ca-file", certificates.ca, "--tls-verify-peer", "--tls-fail-if-no-peer-cert")
    yield broker
    broker.stop()


def round_trip(connection, queue):
    """Declares `queue`, publishes one message with publisher confirms and consumes it back."""
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    body = ("over the wire to " + queue).encode()
    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    for method, _, received in channel.consume(queue, inactivity_timeout=5):
        assert method is not None, "no message consumed back from " + queue
        channel.basic_ack(method.delivery_tag)
        assert received == body
        break
    channel.cancel()
    channel.queue_delete(queue)


def test_pika_over_tls_publishes_with_confirms_and_consumes_while_plain_amqp_works(tls_lepus):
    tls_connection = tls_lepus.connect_tls()
    plain_connection = tls_lepus.connect()
    try:
        round_trip(tls_connection, unique("tls"))
        round_trip(plain_connection, unique("plain"))
        # A message crosses from the TLS listener to the plain one.
        queue = unique("across")
        tls_channel = tls_connection.channel()
        tls_channel.queue_declare(queue)
        tls_channel.basic_publish("", queue, b"from tls")
        plain_channel = plain_connection.channel()
        deadline = time.monotonic() + 5
        got = None
        while got is None and time.monotonic() < deadline:
            got = plain_channel.basic_get(queue, auto_ack=True)[2]
        assert got == b"from tls"

        # This module's first connections: one over TLS, one plain.
        connections = tls_lepus.get("/connections").json()
        [over_tls] = [connection for connection in connections if connection["ssl"] is True]
        [plain] = [connection for connection in connections if connection["ssl"] is False]
        assert over_tls["ssl_protocol"] == "tlsv1.3" and over_tls["ssl_cipher"].startswith("TLS13_")
        assert over_tls["port"] == tls_lepus.amqps_port
        assert over_tls["name"].endswith("-> 127.0.0.1:%d" % tls_lepus.amqps_port)
        assert plain["ssl_protocol"] is None and plain["port"] == tls_lepus.amqp_port
    finally:
        tls_connection.close()
        plain_connection.close()


def test_tls_1_2_is_offered_too(tls_lepus):
    connection = tls_lepus.connect_tls(tls_lepus.tls_context(maximum_version=ssl.TLSVersion.TLSv1_2), server_hostname="127.0.0.1")
    try:
        round_trip(connection, unique("tls12"))
        listed = [listed for listed in tls_lepus.get("/connections").json() if listed["ssl_protocol"] == "tlsv1.2"]
        assert len(listed) == 1 and listed[0]["ssl"] is True
    finally:
        connection.close()


def test_a_client_that_does_not_trust_the_server_certificate_is_refused(tls_lepus):
    with pytest.raises(REFUSED):
        tls_lepus.connect_tls(ssl.create_default_context())  # the system's CAs, not the test CA


def test_fail_if_no_peer_cert_refuses_clients_without_a_certificate_from_the_ca(verifying_lepus):
    broker = verifying_lepus
    certificates = broker.certificates
    with pytest.raises(REFUSED):
        broker.connect_tls(broker.tls_context())
    with pytest.raises(REFUSED):
        broker.connect_tls(broker.tls_context(certificates.stranger, certificates.stranger_key))
    # TLS 1.2 refuses in the handshake itself; the result is the same.
    with pytest.raises(REFUSED):
        broker.connect_tls(broker.tls_context(maximum_version=ssl.TLSVersion.TLSv1_2))
    connection = broker.connect_tls(broker.tls_context(certificates.client, certificates.client_key))
    try:
        round_trip(connection, unique("verified"))
        [listed] = broker.get("/connections").json()
        assert listed["ssl"] is True
        assert listed["peer_cert_subject"] == "CN=lepus-client,O=Lepus tests"
        assert listed["peer_cert_issuer"] == "CN=Lepus test CA"
    finally:
        connection.close()
    # The refusals closed only their own sockets: both listeners still serve.
    plain = broker.connect()
    plain.close()
    again = broker.connect_tls(broker.tls_context(certificates.client, certificates.client_key))
    again.close()
    assert broker.process.poll() is None
    log = open(broker.log.name, "rb").read().decode(errors="replace")
    assert "TLS handshake failed" in log


def test_verify_peer_alone_admits_clients_without_a_certificate_but_not_with_a_bad_one(tmp_path_factory, certificates):
    broker = start(tmp_path_factory, certificates, "--tls-ca-file", certificates.ca, "--tls-verify-peer")
    try:
        broker.connect_tls().close()
        broker.connect_tls(broker.tls_context(certificates.client, certificates.client_key)).close()
        with pytest.raises(REFUSED):
            broker.connect_tls(broker.tls_context(certificates.stranger, certificates.stranger_key))
        broker.connect_tls().close()
    finally:
        broker.stop()


def test_management_api_over_https_answers_as_over_http(tls_lepus):
    over_https = requests.get(tls_lepus.https_api + "/overview", auth=("guest", "guest"), verify=tls_lepus.certificates.ca,
                              timeout=HTTP_TIMEOUT_S)
    over_http = tls_lepus.get("/overview")
    assert over_https.status_code == 200 and over_http.status_code == 200
    assert over_https.headers["content-type"] == over_http.headers["content-type"]
    assert set(over_https.json()) == set(over_http.json())
    listeners = {listener["protocol"]: listener["port"] for listener in over_https.json()["listeners"]}
    # Every listener, as RabbitMQ's overview lists them (amqp, amqp/ssl, http, https, http/prometheus).
    assert listeners == {"amqp": tls_lepus.amqp_port, "amqp/ssl": tls_lepus.amqps_port, "http": tls_lepus.http_port,
                         "https": tls_lepus.https_port, "http/prometheus": tls_lepus.metrics_port}
    # Authentication applies as over HTTP.
    refused = requests.get(tls_lepus.https_api + "/overview", auth=("guest", "wrong"), verify=tls_lepus.certificates.ca,
                           timeout=HTTP_TIMEOUT_S)
    assert refused.status_code == 401
    # A write through HTTPS is seen through HTTP.
    queue = unique("https")
    created = requests.put(tls_lepus.https_api + "/queues/%2F/" + queue, json={"durable": False}, auth=("guest", "guest"),
                           verify=tls_lepus.certificates.ca, timeout=HTTP_TIMEOUT_S)
    assert created.status_code == 201
    assert tls_lepus.get("/queues/%2F/" + queue).json()["name"] == queue
    assert tls_lepus.delete("/queues/%2F/" + queue).status_code == 204


def test_plain_http_to_the_https_port_fails(tls_lepus):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get("http://127.0.0.1:%d/api/overview" % tls_lepus.https_port, auth=("guest", "guest"), timeout=HTTP_TIMEOUT_S)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(tls_lepus.https_api + "/overview", auth=("guest", "guest"), timeout=HTTP_TIMEOUT_S)  # the system's CAs
    assert requests.get(tls_lepus.https_api + "/overview", auth=("guest", "guest"), verify=tls_lepus.certificates.ca,
                        timeout=HTTP_TIMEOUT_S).status_code == 200


def read_until_closed(sock, timeout_s=5.0):
    """What the server sends until it closes the socket (or the timeout)."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return received
            received += chunk
    except ConnectionResetError:
        return received


def test_garbage_and_plain_amqp_on_the_amqps_port_close_only_that_socket(tls_lepus):
    # A client that connects and says nothing does not keep others out.
    silent = socket.create_connection(("127.0.0.1", tls_lepus.amqps_port), timeout=5)
    try:
        for payload in [b"AMQP\x00\x00\x09\x01", os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello"]:
            with socket.create_connection(("127.0.0.1", tls_lepus.amqps_port), timeout=5) as sock:
                sock.sendall(payload)
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                # Whatever rustls answers (an alert, or nothing), the broker closes the socket.
                answer = read_until_closed(sock)
                assert b"AMQP" not in answer
        round_trip(tls_lepus.connect_tls(), unique("after-garbage"))
        plain = tls_lepus.connect()
        plain.close()
    finally:
        silent.close()
    assert tls_lepus.process.poll() is None


def run_server(tmp_path, *arguments):
    return subprocess.run([lepus_binary(), "server", "--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1",
                           "--amqp-port", str(free_port()), "--http-port", "0", "--metrics-port", "0",
                           "--amqps-port", str(free_port()), "--https-port", "0", *arguments],
                          capture_output=True, timeout=30, text=True)


def test_inconsistent_or_bad_tls_settings_stop_the_start_with_a_clear_message(tmp_path, certificates):
    only_cert = run_server(tmp_path, "--tls-cert-file", certificates.server)
    assert only_cert.returncode != 0
    assert "tls_cert_file is set but tls_key_file is not" in only_cert.stderr

    verify_without_ca = run_server(tmp_path, "--tls-cert-file", certificates.server, "--tls-key-file", certificates.server_key,
                                   "--tls-verify-peer")
    assert verify_without_ca.returncode != 0 and "tls_verify_peer needs tls_ca_file" in verify_without_ca.stderr

    missing = run_server(tmp_path, "--tls-cert-file", str(tmp_path / "nope.pem"), "--tls-key-file", certificates.server_key)
    assert missing.returncode != 0 and "tls_cert_file" in missing.stderr and "nope.pem" in missing.stderr

    not_pem = tmp_path / "not.pem"
    not_pem.write_text("this is not a certificate\n")
    garbage_cert = run_server(tmp_path, "--tls-cert-file", str(not_pem), "--tls-key-file", certificates.server_key)
    assert garbage_cert.returncode != 0 and "no PEM certificate" in garbage_cert.stderr
    garbage_key = run_server(tmp_path, "--tls-cert-file", certificates.server, "--tls-key-file", str(not_pem))
    assert garbage_key.returncode != 0 and "no PEM private key" in garbage_key.stderr

    # The client's key with the server's certificate.
    mismatch = run_server(tmp_path, "--tls-cert-file", certificates.server, "--tls-key-file", certificates.client_key)
    assert mismatch.returncode != 0 and "does not fit" in mismatch.stderr
    assert "panicked" not in mismatch.stderr


def test_print_config_shows_the_tls_settings(tmp_path, certificates):
    printed = run_server(tmp_path, "--tls-cert-file", certificates.server, "--tls-key-file", certificates.server_key,
                         "--tls-ca-file", certificates.ca, "--tls-verify-peer", "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert 'tls_cert_file = "%s"' % certificates.server in printed.stdout
    assert "tls_verify_peer = true" in printed.stdout and "tls_fail_if_no_peer_cert = false" in printed.stdout
    assert "https_port = 0" in printed.stdout
