# Sourced by bench scripts that time a broker's start: `wait_for_connection_start PORT` returns once
# the broker on 127.0.0.1:PORT answers the AMQP protocol header (connection.start). A TCP connect is
# no measure: Lepus binds its port before recovery, so a connect succeeds at once.
wait_for_connection_start() {
  python3 - "$1" <<'PY'
import socket, sys, time
while True:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            if s.recv(1):
                break
    except OSError:
        time.sleep(0.005)
PY
}
