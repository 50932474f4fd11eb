package weather

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds what is read of one Open-Meteo answer; a forecast for 7
// days is a few KiB, so anything near this is not the API we expect.
const maxBody = 1 << 20

// client talks to Open-Meteo's geocoding and forecast APIs (no key).
type client struct {
	http         *http.Client
	geocodingURL string // base, no trailing slash
	forecastURL  string
	timeout      time.Duration
}

// place is one result of GET /v1/search (fields as documented at
// open-meteo.com/en/docs/geocoding-api).
type place struct {
	Name        string  `json:"name"`
	Latitude    float64 `json:"latitude"`
	Longitude   float64 `json:"longitude"`
	Elevation   float64 `json:"elevation"`
	Timezone    string  `json:"timezone"`
	CountryCode string  `json:"country_code"`
	Country     string  `json:"country"`
	Admin1      string  `json:"admin1"`
}

type searchResponse struct {
	Results []place `json:"results"`
	apiError
}

// apiError is the body every Open-Meteo API sends on a bad request:
// {"error": true, "reason": "..."}.
type apiError struct {
	Error  bool   `json:"error"`
	Reason string `json:"reason"`
}

// forecastResponse is the part of GET /v1/forecast we ask for.
type forecastResponse struct {
	Latitude     float64           `json:"latitude"`
	Longitude    float64           `json:"longitude"`
	Timezone     string            `json:"timezone"`
	Elevation    float64           `json:"elevation"`
	CurrentUnits map[string]string `json:"current_units"`
	Current      struct {
		Time               string   `json:"time"`
		Temperature2m      *float64 `json:"temperature_2m"`
		RelativeHumidity2m *float64 `json:"relative_humidity_2m"`
		WindSpeed10m       *float64 `json:"wind_speed_10m"`
		WeatherCode        *int     `json:"weather_code"`
	} `json:"current"`
	DailyUnits map[string]string `json:"daily_units"`
	Daily      struct {
		Time             []string   `json:"time"`
		Temperature2mMax []*float64 `json:"temperature_2m_max"`
		Temperature2mMin []*float64 `json:"temperature_2m_min"`
		PrecipitationSum []*float64 `json:"precipitation_sum"`
		WeatherCode      []*int     `json:"weather_code"`
	} `json:"daily"`
	apiError
}

const (
	currentVars = "temperature_2m,relative_humidity_2m,wind_speed_10m,weather_code"
	dailyVars   = "temperature_2m_max,temperature_2m_min,precipitation_sum,weather_code"
)

// geocode returns the best match for city, or an error the model can act
// on when there is none.
func (c *client) geocode(ctx context.Context, city string) (place, error) {
	q := url.Values{"name": {city}, "count": {"1"}, "language": {"en"}, "format": {"json"}}
	var r searchResponse
	if err := c.getJSON(ctx, "geocoding", c.geocodingURL+"/v1/search?"+q.Encode(), &r); err != nil {
		return place{}, err
	}
	if r.Error {
		return place{}, fmt.Errorf("Open-Meteo geocoding rejected the request: %s", r.Reason)
	}
	if len(r.Results) == 0 {
		return place{}, fmt.Errorf("Open-Meteo knows no place named %q: check the spelling, or try the English name of the city or of a larger town nearby", city)
	}
	return r.Results[0], nil
}

func (c *client) forecast(ctx context.Context, p place, days int) (forecastResponse, error) {
	q := url.Values{
		"latitude":      {strconv.FormatFloat(p.Latitude, 'f', -1, 64)},
		"longitude":     {strconv.FormatFloat(p.Longitude, 'f', -1, 64)},
		"current":       {currentVars},
		"daily":         {dailyVars},
		"timezone":      {"auto"},
		"forecast_days": {strconv.Itoa(days)},
	}
	var r forecastResponse
	if err := c.getJSON(ctx, "forecast", c.forecastURL+"/v1/forecast?"+q.Encode(), &r); err != nil {
		return forecastResponse{}, err
	}
	if r.Error {
		return forecastResponse{}, fmt.Errorf("Open-Meteo forecast rejected the request: %s", r.Reason)
	}
	d := r.Daily
	n := len(d.Time)
	if n == 0 || len(d.Temperature2mMax) != n || len(d.Temperature2mMin) != n || len(d.PrecipitationSum) != n ||
		(d.WeatherCode != nil && len(d.WeatherCode) != n) {
		return forecastResponse{}, fmt.Errorf("Open-Meteo forecast answered without a usable daily series (%d days, %d/%d/%d values); try again later",
			n, len(d.Temperature2mMax), len(d.Temperature2mMin), len(d.PrecipitationSum))
	}
	return r, nil
}

// getJSON GETs u under the configured timeout and decodes a JSON answer
// into v. Every failure names the API and says what the model can do.
func (c *client) getJSON(ctx context.Context, api, u string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("building the Open-Meteo %s request: %w", api, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "gpuhost-mcp-weather")
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("Open-Meteo %s did not answer within %v; try again later: %w", api, c.timeout, context.DeadlineExceeded)
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL is ours, not news to the model
		}
		return fmt.Errorf("Open-Meteo %s is not reachable; try again later: %w", api, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("Open-Meteo %s did not finish its answer within %v; try again later: %w", api, c.timeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("reading the Open-Meteo %s answer: %w", api, err)
	}
	if len(body) > maxBody {
		return fmt.Errorf("Open-Meteo %s answered with more than %d bytes; that is not the documented API", api, maxBody)
	}
	if resp.StatusCode != http.StatusOK {
		var e apiError
		if json.Unmarshal(body, &e) == nil && e.Error && e.Reason != "" {
			return fmt.Errorf("Open-Meteo %s rejected the request (HTTP %d): %s", api, resp.StatusCode, e.Reason)
		}
		return fmt.Errorf("Open-Meteo %s answered HTTP %s; try again later", api, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return fmt.Errorf("Open-Meteo %s answered with %q instead of JSON (a proxy or captive portal in the way?); try again later", api, strings.TrimSpace(ct))
		}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("Open-Meteo %s answered with JSON that does not parse: %w", api, err)
	}
	return nil
}
