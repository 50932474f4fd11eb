// Package weather is the MCP weather connector: weather_forecast looks a
// city up with Open-Meteo's geocoding API and returns the current weather
// and a 1-7 day daily forecast from its forecast API. Open-Meteo needs no
// key. The city is the one free-text input among gpuhost's tools; it is
// allowed because it only ever becomes an escaped query parameter of a
// fixed URL and the result is only the API's data.
//
// Config section in gpuhost.yaml (all keys optional; defaults shown):
//
//	mcp:
//	  connectors:
//	    weather:
//	      geocoding_url: https://geocoding-api.open-meteo.com
//	      forecast_url: https://api.open-meteo.com
//	      timeout: 10s   # per HTTP call
package weather
