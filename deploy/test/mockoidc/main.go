// A mock OpenID Connect provider for deploy/test/signin.py, built on
// github.com/oauth2-proxy/mockoidc (a provider made for tests).
//
// Usage: mockoidc [-addr 127.0.0.1:0]
//
// It prints one JSON line once it serves:
//
//	{"issuer": "...", "client_id": "...", "client_secret": "...", "control": "http://..."}
//
// and serves until stdin closes or it is signalled. The control address takes
// POST /user with a JSON body {"subject", "email", "username", "groups"}: the
// next sign-in is that user (sign-ins without one queued are mockoidc's
// default user, jane.doe).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/oauth2-proxy/mockoidc"
)

type queued struct {
	Subject  string   `json:"subject"`
	Email    string   `json:"email"`
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address the provider listens on")
	flag.Parse()

	m, err := mockoidc.NewServer(nil)
	if err != nil {
		log.Fatalf("mockoidc: %v", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("mockoidc: cannot listen on %s: %v", *addr, err)
	}
	if err := m.Start(ln, nil); err != nil {
		log.Fatalf("mockoidc: %v", err)
	}

	control, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("mockoidc: cannot listen for control: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/user", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST a JSON user", http.StatusMethodNotAllowed)
			return
		}
		var u queued
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&u); err != nil || u.Subject == "" {
			http.Error(w, "want {\"subject\": ..., \"email\": ..., \"username\": ..., \"groups\": [...]}", http.StatusBadRequest)
			return
		}
		m.QueueUser(&mockoidc.MockUser{
			Subject:           u.Subject,
			Email:             u.Email,
			EmailVerified:     true,
			PreferredUsername: u.Username,
			Groups:            u.Groups,
		})
		w.WriteHeader(http.StatusNoContent)
	})
	go func() { log.Fatal(http.Serve(control, mux)) }()

	cfg := m.Config()
	line, _ := json.Marshal(map[string]string{
		"issuer":        cfg.Issuer,
		"client_id":     cfg.ClientID,
		"client_secret": cfg.ClientSecret,
		"control":       "http://" + control.Addr().String(),
	})
	fmt.Println(string(line))
	// Until whoever started it goes away.
	_, _ = io.Copy(io.Discard, os.Stdin)
}
