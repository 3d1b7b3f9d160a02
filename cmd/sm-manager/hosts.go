package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// printHosts is sm-manager -hosts: it asks the manager at socket for STATUS
// and prints the mesh's hosts (id, capacity, clusters held, lease age) and
// which host runs each cluster; on a single host it says so.
func printHosts(socket string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "sm-manager -hosts"}})
	if err != nil {
		return fmt.Errorf("-hosts: no manager at the config's socket: %w", err)
	}
	defer c.Close()
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		return fmt.Errorf("-hosts: STATUS: %w", err)
	}
	var st manager.Status
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		return fmt.Errorf("-hosts: STATUS reply: %w", err)
	}
	if len(st.Hosts) == 0 {
		_, err := fmt.Fprintln(w, "no mesh: this manager is a single host ([mesh] nats_url is empty), or has not joined yet")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tCAPACITY\tCLUSTERS\tHELD\tLEASE AGE\t")
	held := 0
	for _, h := range st.Hosts {
		capacity := "no limit"
		if h.Capacity > 0 {
			capacity = strconv.Itoa(h.Capacity)
		}
		id := h.ID
		if h.Self {
			id += " (this host)"
		}
		ids := make([]string, len(h.Clusters))
		for i, c := range h.Clusters {
			ids[i] = strconv.Itoa(c)
		}
		held += len(h.Clusters)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\t\n", id, capacity, len(h.Clusters), strings.Join(ids, " "), time.Duration(h.LeaseAgeMS)*time.Millisecond)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	unheld := 0
	for _, c := range st.Clusters {
		if c.HostID == "" {
			unheld++
		}
	}
	_, err = fmt.Fprintf(w, "%d hosts, %d of %d clusters held, %d unplaced\n", len(st.Hosts), held, len(st.Clusters), unheld)
	return err
}
