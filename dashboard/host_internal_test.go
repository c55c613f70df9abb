package dashboard

import "testing"

// TestHostsAllows checks the Host values the default (loopback only)
// answers, including the odd ones a client other than a browser may send.
func TestHostsAllows(t *testing.T) {
	t.Parallel()
	h, err := newHosts(nil)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"127.0.0.1:7433": true, "127.0.0.1": true, "127.1.2.3:80": true, "localhost:7433": true, "LOCALHOST": true,
		"app.localhost:3000": true, "[::1]:7433": true, "[::1]": true, "::1": true, "[::ffff:127.0.0.1]:7433": true,
		"": false, ":7433": false, "attacker.example": false, "attacker.example:7433": false, "localhost.": false,
		"localhost:": false, "localhost:x": false, "localhost:99999": false, "[::1": false, "127.0.0.1.nip.io:7433": false,
		"0.0.0.0:7433": false, "[::]:7433": false, "10.0.0.5:7433": false, "evil-localhost:7433": false, "1::2::3": false,
	} {
		if got := h.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
}
