package app

import (
	"strings"
	"testing"

	"socialweb.computer/internal/market/bidder"
)

// A local bidder's price: zero bids free, as up's bidders always did; any part set prices
// its bids by size; a part below zero or a currency no bid holds is refused, naming the flag.
func TestLocalPrice(t *testing.T) {
	for _, c := range []struct {
		name   string
		price  LocalPrice
		want   bidder.Config
		line   string
		refuse string // a part of CheckPrice's error; "": none
	}{
		{"zero is free", LocalPrice{Currency: "USD"}, bidder.Config{Free: true}, "free bids", ""},
		{"zero without a currency is free", LocalPrice{}, bidder.Config{Free: true}, "free bids", ""},
		{"per CPU only is priced", LocalPrice{PerCPU: 3, Currency: "USD"}, bidder.Config{CostPerCPU: 3, Currency: "USD"},
			"bids of 0 USD per hour per guest + 3 per CPU + 0 per GiB", ""},
		{"all parts", LocalPrice{Cost: 10, PerCPU: 5, PerGiB: 2, Currency: "EUR"}, bidder.Config{Cost: 10, CostPerCPU: 5, CostPerGiB: 2, Currency: "EUR"},
			"bids of 10 EUR per hour per guest + 5 per CPU + 2 per GiB", ""},
		{"negative cost", LocalPrice{Cost: -1, Currency: "USD"}, bidder.Config{Cost: -1, Currency: "USD"}, "", "--node-cost -1: want 0 or more"},
		{"negative per GiB", LocalPrice{PerGiB: -5, Currency: "USD"}, bidder.Config{CostPerGiB: -5, Currency: "USD"}, "", "--node-cost-per-gib -5: want 0 or more"},
		{"currency too long", LocalPrice{Cost: 1, Currency: strings.Repeat("X", 17)}, bidder.Config{Cost: 1, Currency: strings.Repeat("X", 17)}, "", "--node-currency"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckPrice("node-", c.price)
			if c.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), c.refuse) {
					t.Fatalf("CheckPrice = %v, want an error with %q", err, c.refuse)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckPrice = %v", err)
			}
			var got bidder.Config
			c.price.apply(&got)
			if got.Free != c.want.Free || got.Cost != c.want.Cost || got.CostPerCPU != c.want.CostPerCPU || got.CostPerGiB != c.want.CostPerGiB || got.Currency != c.want.Currency {
				t.Errorf("config %+v, want %+v", got, c.want)
			}
			if s := c.price.String(); s != c.line {
				t.Errorf("String() = %q, want %q", s, c.line)
			}
		})
	}
}
