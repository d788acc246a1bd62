# A private RabbitMQ node for the bench scripts (Debian's rabbitmq-server, 3.10.8 here), on free
# ports, with its own data directory, so it runs beside other nodes on a shared machine. Source it.
#
#   rabbitmq_start BASE_DIR    starts (or restarts on the same BASE_DIR) the node; sets RABBITMQ_NODE,
#                              RABBITMQ_AMQP_PORT, RABBITMQ_AMQP_URL and RABBITMQ_BEAM_PID (the Erlang VM,
#                              whose /proc entries give its RSS, CPU time and descriptors)
#   rabbitmq_stop              a graceful stop (rabbitmqctl stop), waits for it
#   rabbitmq_kill              kill -9 of the VM (a crash)
# Environment: RABBITMQ_DESCRIPTORS (the node's `ulimit -n`, soft and hard; unchanged when empty),
#              RABBITMQ_PLUGINS (enabled plugins, an Erlang list; default none: "[]"),
#              RABBITMQ_CONF_EXTRA (lines appended to its rabbitmq.conf, e.g. the stream listener).

rabbitmq_free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rabbitmq_start() {
  local base=$1
  mkdir -p "$base/mnesia" "$base/log"
  if [[ ! -f $base/ports ]]; then
    echo "$(rabbitmq_free_port) $(rabbitmq_free_port) lepus-bench-$$-$RANDOM@localhost" >"$base/ports"
    echo "${RABBITMQ_PLUGINS:-[]}." >"$base/enabled_plugins"
  fi
  read -r RABBITMQ_AMQP_PORT dist_port RABBITMQ_NODE <"$base/ports"
  cat >"$base/rabbitmq.conf" <<CONF
listeners.tcp.default = $RABBITMQ_AMQP_PORT
loopback_users = none
${RABBITMQ_CONF_EXTRA:-}
CONF
  if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq:rabbitmq "$base"; fi
  (
    if [[ -n ${RABBITMQ_DESCRIPTORS:-} ]]; then ulimit -n "$RABBITMQ_DESCRIPTORS"; fi
    cd "$base" # where an Erlang crash dump lands
    export RABBITMQ_NODENAME=$RABBITMQ_NODE RABBITMQ_DIST_PORT=$dist_port RABBITMQ_CONFIG_FILE=$base/rabbitmq.conf \
      RABBITMQ_MNESIA_BASE=$base/mnesia RABBITMQ_LOG_BASE=$base/log RABBITMQ_ENABLED_PLUGINS_FILE=$base/enabled_plugins
    # Debian's rabbitmq-server switches to the rabbitmq user with su, whose PAM session puts the
    # soft descriptor limit back to 1,024 (RabbitMQ then fails with emfile at about 1,000
    # connections); switching without PAM keeps the limit asked for.
    if [[ -n ${RABBITMQ_DESCRIPTORS:-} && $(id -u) == 0 ]] && command -v setpriv >/dev/null && [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
      exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server
    fi
    exec rabbitmq-server
  ) >>"$base/server.out" 2>&1 &
  RABBITMQ_SERVER_PID=$!
  RABBITMQ_AMQP_URL="amqp://guest:guest@127.0.0.1:$RABBITMQ_AMQP_PORT/"
  RABBITMQ_BEAM_PID=""
  for _ in $(seq 1 600); do
    RABBITMQ_BEAM_PID=$(rabbitmqctl -n "$RABBITMQ_NODE" eval 'list_to_integer(os:getpid()).' 2>/dev/null | tr -dc 0-9) || true
    [[ -n $RABBITMQ_BEAM_PID ]] && break
    kill -0 "$RABBITMQ_SERVER_PID" 2>/dev/null || { echo "rabbitmq-server exited: $(tail -5 "$base/server.out")" >&2; return 1; }
    sleep 0.2
  done
  [[ -n $RABBITMQ_BEAM_PID ]] || { echo "rabbitmq did not answer rabbitmqctl" >&2; return 1; }
  # The VM answers rabbitmqctl before the AMQP listener is up.
  for _ in $(seq 1 600); do (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ_AMQP_PORT") 2>/dev/null && return 0; sleep 0.2; done
  echo "rabbitmq did not listen on $RABBITMQ_AMQP_PORT" >&2; return 1
}

rabbitmq_stop() {
  timeout 600 rabbitmqctl -n "$RABBITMQ_NODE" stop >/dev/null 2>&1 || kill "$RABBITMQ_BEAM_PID" 2>/dev/null || true
  wait "$RABBITMQ_SERVER_PID" 2>/dev/null || true
  while kill -0 "$RABBITMQ_BEAM_PID" 2>/dev/null; do sleep 0.1; done
}

rabbitmq_kill() {
  kill -9 "$RABBITMQ_BEAM_PID" 2>/dev/null || true
  wait "$RABBITMQ_SERVER_PID" 2>/dev/null || true
  while kill -0 "$RABBITMQ_BEAM_PID" 2>/dev/null; do sleep 0.1; done
  # epmd keeps the node's name registered for a moment; the next start waits for it.
}
