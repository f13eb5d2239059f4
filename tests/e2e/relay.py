"""What every ProxyCommand relay of the e2e tests ends with: after its own prelude (waiting,
logging), it relays stdin and stdout to the test sshd's ``port`` until either side closes."""

RELAY_FORWARDING = """\
sock = socket.create_connection(("127.0.0.1", port))
selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ)
selector.register(sock, selectors.EVENT_READ)
while True:
    for key, _ in selector.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                selector.unregister(0)
                sock.shutdown(socket.SHUT_WR)
            else:
                sock.sendall(data)
        else:
            data = sock.recv(65536)
            if not data:
                sys.exit(0)
            os.write(1, data)
"""
