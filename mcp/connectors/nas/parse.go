package nas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ParseResponse reads DSM's envelope {"success":bool,"data":…,"error":{"code":N}}
// and returns data, or a *DSMError.
func ParseResponse(body []byte) (json.RawMessage, error) {
	var env struct {
		Success *bool           `json:"success"`
		Data    json.RawMessage `json:"data"`
		Error   struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("decode DSM answer: %w", err)
	}
	if env.Success == nil {
		return nil, errors.New(`DSM answer has no "success" field`)
	}
	if !*env.Success {
		return nil, &DSMError{Code: env.Error.Code}
	}
	return env.Data, nil
}

// num accepts a JSON number or a numeric string (DSM sends sizes as
// strings so they survive 53-bit JavaScript numbers).
type num float64

func (n *num) UnmarshalJSON(b []byte) error {
	b = bytes.Trim(b, `"`)
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("not a number: %.40q", b)
	}
	*n = num(f)
	return nil
}

// Share is one shared folder.
type Share struct {
	Name       string  `json:"name"`
	Path       string  `json:"path"`
	FreeBytes  *uint64 `json:"free_bytes,omitempty"`
	TotalBytes *uint64 `json:"total_bytes,omitempty"`
	ReadOnly   bool    `json:"read_only,omitempty"`
}

// ParseShares reads SYNO.FileStation.List list_share data.
func ParseShares(data json.RawMessage) ([]Share, error) {
	var d struct {
		Shares []struct {
			Name       string `json:"name"`
			Path       string `json:"path"`
			Additional struct {
				VolumeStatus *struct {
					FreeSpace  num  `json:"freespace"`
					TotalSpace num  `json:"totalspace"`
					ReadOnly   bool `json:"readonly"`
				} `json:"volume_status"`
			} `json:"additional"`
		} `json:"shares"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode shares: %w", err)
	}
	out := make([]Share, 0, len(d.Shares))
	for _, s := range d.Shares {
		sh := Share{Name: s.Name, Path: s.Path}
		if vs := s.Additional.VolumeStatus; vs != nil {
			sh.FreeBytes, sh.TotalBytes, sh.ReadOnly = u64(vs.FreeSpace), u64(vs.TotalSpace), vs.ReadOnly
		}
		out = append(out, sh)
	}
	return out, nil
}

func u64(n num) *uint64 {
	if n < 0 || float64(n) > math.MaxUint64 {
		return nil
	}
	v := uint64(n)
	return &v
}

// Utilization is nas_utilization's result.
type Utilization struct {
	NAS     string  `json:"nas"`
	CPU     CPU     `json:"cpu"`
	Memory  Memory  `json:"memory"`
	Network []Iface `json:"network"`
}

// CPU load in percent; TotalPercent = user + system + other.
type CPU struct {
	TotalPercent  float64 `json:"total_percent"`
	UserPercent   float64 `json:"user_percent"`
	SystemPercent float64 `json:"system_percent"`
	OtherPercent  float64 `json:"other_percent"`
}

// Memory use; DSM reports KiB.
type Memory struct {
	TotalMiB     float64 `json:"total_mib"`
	AvailableMiB float64 `json:"available_mib"`
	UsedPercent  float64 `json:"used_percent"`
}

// Iface is one network device's throughput ("total" sums all).
type Iface struct {
	Device      string  `json:"device"`
	RxBytesPerS float64 `json:"rx_bytes_per_s"`
	TxBytesPerS float64 `json:"tx_bytes_per_s"`
}

// ParseUtilization reads SYNO.Core.System.Utilization get data.
func ParseUtilization(data json.RawMessage) (*Utilization, error) {
	var d struct {
		CPU *struct {
			User   num `json:"user_load"`
			System num `json:"system_load"`
			Other  num `json:"other_load"`
		} `json:"cpu"`
		Memory *struct {
			Size      num `json:"memory_size"`
			AvailReal num `json:"avail_real"`
			RealUsage num `json:"real_usage"`
		} `json:"memory"`
		Network []struct {
			Device string `json:"device"`
			Rx     num    `json:"rx"`
			Tx     num    `json:"tx"`
		} `json:"network"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode utilization: %w", err)
	}
	if d.CPU == nil || d.Memory == nil {
		return nil, errors.New("utilization has no cpu or memory section")
	}
	u := &Utilization{
		CPU: CPU{
			TotalPercent: float64(d.CPU.User + d.CPU.System + d.CPU.Other),
			UserPercent:  float64(d.CPU.User), SystemPercent: float64(d.CPU.System), OtherPercent: float64(d.CPU.Other),
		},
		Memory: Memory{
			TotalMiB: round1(float64(d.Memory.Size) / 1024), AvailableMiB: round1(float64(d.Memory.AvailReal) / 1024),
			UsedPercent: float64(d.Memory.RealUsage),
		},
		Network: make([]Iface, 0, len(d.Network)),
	}
	for _, n := range d.Network {
		u.Network = append(u.Network, Iface{Device: n.Device, RxBytesPerS: float64(n.Rx), TxBytesPerS: float64(n.Tx)})
	}
	return u, nil
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

// Volume is one storage volume.
type Volume struct {
	ID          string   `json:"id"`
	Path        string   `json:"path"`
	Status      string   `json:"status"`
	FSType      string   `json:"fs_type,omitempty"`
	TotalBytes  *uint64  `json:"total_bytes,omitempty"`
	UsedBytes   *uint64  `json:"used_bytes,omitempty"`
	UsedPercent *float64 `json:"used_percent,omitempty"`
}

// ParseVolumes reads SYNO.Storage.CGI.Storage load_info data.
func ParseVolumes(data json.RawMessage) ([]Volume, error) {
	var d struct {
		Volumes *[]struct {
			ID      string `json:"id"`
			VolPath string `json:"vol_path"`
			Status  string `json:"status"`
			FSType  string `json:"fs_type"`
			Size    struct {
				Total num `json:"total"`
				Used  num `json:"used"`
			} `json:"size"`
		} `json:"volumes"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode volumes: %w", err)
	}
	if d.Volumes == nil {
		return nil, errors.New(`answer has no "volumes" list`)
	}
	out := make([]Volume, 0, len(*d.Volumes))
	for _, v := range *d.Volumes {
		vol := Volume{ID: v.ID, Path: v.VolPath, Status: v.Status, FSType: v.FSType}
		if v.Size.Total > 0 {
			vol.TotalBytes, vol.UsedBytes = u64(v.Size.Total), u64(v.Size.Used)
			p := math.Round(float64(v.Size.Used)/float64(v.Size.Total)*1000) / 10
			vol.UsedPercent = &p
		}
		out = append(out, vol)
	}
	return out, nil
}
